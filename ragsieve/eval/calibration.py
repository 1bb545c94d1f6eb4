"""Calibration of a binary probability (P(correct), P(relevant), ...): reliability bins, ECE and a reliability diagram.

This is the positive-class view (as in ``sklearn.calibration.calibration_curve``):
a bin's confidence is the mean predicted P(y=1) and its accuracy the fraction of
y=1 in the bin. Bins are equal-width on [0, 1], left-closed ``[lower, upper)``, the
last one also holding 1.0 (sklearn's convention).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ragsieve.errors import DataError, RagsieveError


class ReliabilityBin(NamedTuple):
    """One probability bin; ``mean_confidence`` and ``accuracy`` are None when empty."""

    lower: float
    upper: float
    mean_confidence: float | None
    accuracy: float | None
    count: int


def _inputs(y_true: Sequence[int], probs: Sequence[float], n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise RagsieveError(f"n_bins must be a positive integer, got {n_bins!r}")
    true = np.asarray(y_true)
    prob = np.asarray(probs, dtype=np.float64)
    if true.ndim != 1 or prob.shape != true.shape:
        raise DataError(f"y_true {true.shape} and probs {prob.shape} must be flat and the same length")
    if true.size == 0:
        raise DataError("no examples to calibrate (y_true is empty)")
    if not np.isin(true, (0, 1)).all():
        raise DataError("y_true must contain only 0/1 labels")
    if not (np.isfinite(prob).all() and (prob >= 0).all() and (prob <= 1).all()):
        raise DataError("probs must be probabilities in [0, 1] (no NaN)")
    return true.astype(np.float64), prob


def reliability_bins(
    y_true: Sequence[int], probs: Sequence[float], n_bins: int = 10
) -> list[ReliabilityBin]:
    """Per-bin (lower, upper, mean_confidence, accuracy, count), all ``n_bins`` bins.

    >>> [tuple(b) for b in reliability_bins([0, 1, 1], [0.25, 0.5, 0.75], n_bins=2)]
    [(0.0, 0.5, 0.25, 0.0, 1), (0.5, 1.0, 0.625, 1.0, 2)]
    """
    true, prob = _inputs(y_true, probs, n_bins)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    index = np.searchsorted(edges[1:-1], prob, side="right")
    bins = []
    for i in range(n_bins):
        mask = index == i
        count = int(mask.sum())
        bins.append(
            ReliabilityBin(
                lower=float(edges[i]),
                upper=float(edges[i + 1]),
                mean_confidence=float(prob[mask].mean()) if count else None,
                accuracy=float(true[mask].mean()) if count else None,
                count=count,
            )
        )
    return bins


def expected_calibration_error(
    y_true: Sequence[int], probs: Sequence[float], n_bins: int = 10
) -> float:
    """ECE = sum over bins of (count / n) * |accuracy - mean_confidence|.

    >>> round(expected_calibration_error([0, 1, 1], [0.25, 0.5, 0.75], n_bins=2), 4)
    0.3333
    """
    bins = reliability_bins(y_true, probs, n_bins)
    n = sum(b.count for b in bins)
    return float(
        sum(b.count / n * abs(b.accuracy - b.mean_confidence) for b in bins if b.count)
    )


def plot_reliability_diagram(
    y_true: Sequence[int],
    probs: Sequence[float],
    path: str | Path,
    title: str = "Reliability diagram",
    n_bins: int = 10,
    xlabel: str = "predicted P(positive)",
) -> Path:
    """Write a reliability diagram PNG (accuracy bars, diagonal, count histogram); returns path.

    Uses matplotlib's Agg canvas directly (no pyplot), leaving the process backend alone.

    >>> plot_reliability_diagram(labels, p_relevant, "out/rel.png", "judge")  # doctest: +SKIP
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    bins = reliability_bins(y_true, probs, n_bins)
    ece = expected_calibration_error(y_true, probs, n_bins)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    width = 1.0 / n_bins
    centers = [(b.lower + b.upper) / 2 for b in bins]
    filled = [b for b in bins if b.count]

    fig = Figure(figsize=(4.5, 5.5), dpi=120)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.bar(
        [(b.lower + b.upper) / 2 for b in filled], [b.accuracy for b in filled],
        width=width, edgecolor="black", color="tab:blue", alpha=0.8, label="fraction positive",
    )
    top.plot(
        [b.mean_confidence for b in filled], [b.accuracy for b in filled],
        "o", color="tab:orange", markersize=4, label="bin mean confidence",
    )
    top.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_ylabel("fraction positive")
    top.set_title(f"{title} (ECE = {ece:.3f})")
    top.legend(loc="upper left", fontsize="small")

    bottom.bar(centers, [b.count for b in bins], width=width, edgecolor="black", color="tab:gray")
    bottom.set_xlabel(xlabel)
    bottom.set_ylabel("count")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path
