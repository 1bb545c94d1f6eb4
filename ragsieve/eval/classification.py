"""Binary classification metrics for keep/drop decisions (label 1 = relevant / keep).

scikit-learn and matplotlib take ~2 s and ~1 s to import, so they are imported inside
the functions that need them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragsieve.errors import DataError, RagsieveError

THRESHOLD_METRICS = ("f1", "accuracy", "balanced_accuracy")


def _binary(values: Sequence[Any], name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise DataError(f"{name} must be a flat sequence, got shape {arr.shape}")
    if arr.size and not np.isin(arr, (0, 1)).all():
        bad = sorted({str(v) for v in arr[~np.isin(arr, (0, 1))].tolist()})[:5]
        raise DataError(f"{name} must contain only 0/1 labels, found {bad}")
    return arr.astype(np.int64)


def _scores(values: Sequence[float], name: str, n: int) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise DataError(f"{name} has shape {arr.shape}, expected ({n},) to match the labels")
    if not np.isfinite(arr).all():
        raise DataError(f"{name} contains NaN or infinite values")
    return arr


def classification_metrics(
    y_true: Sequence[int],
    y_pred: Sequence[int],
    y_score: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Accuracy, precision/recall/F1 of class 1, AUROC and the confusion matrix.

    Args:
        y_true: gold 0/1 labels.
        y_pred: predicted 0/1 labels.
        y_score: optional scores for class 1 (any monotone scale) for AUROC.

    Returns:
        ``accuracy, precision, recall, f1`` (zero_division=0), ``auroc`` (None without
        scores or when ``y_true`` has a single class), ``confusion_matrix`` as
        ``[[tn, fp], [fn, tp]]``, ``n``, ``positive_rate`` (fraction *predicted* 1)
        and ``base_rate`` (fraction *truly* 1).

    >>> m = classification_metrics([1, 0, 1, 0], [1, 0, 0, 0], [0.9, 0.2, 0.4, 0.3])
    >>> m["precision"], m["recall"], m["auroc"], m["confusion_matrix"]
    (1.0, 0.5, 1.0, [[2, 0], [1, 1]])
    """
    from sklearn.metrics import (
        accuracy_score,
        confusion_matrix,
        precision_recall_fscore_support,
        roc_auc_score,
    )

    true = _binary(y_true, "y_true")
    pred = _binary(y_pred, "y_pred")
    if true.shape != pred.shape:
        raise DataError(f"y_true has {true.size} labels but y_pred has {pred.size}")
    if true.size == 0:
        raise DataError("no examples to evaluate (y_true is empty)")

    precision, recall, f1, _ = precision_recall_fscore_support(
        true, pred, average="binary", pos_label=1, zero_division=0
    )
    auroc = None
    if y_score is not None:
        score = _scores(y_score, "y_score", true.size)
        if np.unique(true).size == 2:
            auroc = float(roc_auc_score(true, score))
    return {
        "accuracy": float(accuracy_score(true, pred)),
        "precision": float(precision),
        "recall": float(recall),
        "f1": float(f1),
        "auroc": auroc,
        "confusion_matrix": confusion_matrix(true, pred, labels=[0, 1]).tolist(),
        "n": int(true.size),
        "positive_rate": float(pred.mean()),
        "base_rate": float(true.mean()),
    }


def accuracy_interval(correct: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of an accuracy of ``correct`` out of ``n`` (scipy's ``binomtest``).

    Small evaluation sets are noisy: 12 of 24 right is anywhere from 31 % to 69 %.

    >>> [round(x, 3) for x in accuracy_interval(12, 24)]
    [0.314, 0.686]
    """
    from scipy.stats import binomtest

    if n <= 0:
        raise DataError("an accuracy interval needs at least one example")
    if not 0 <= correct <= n:
        raise DataError(f"correct must lie in [0, {n}], got {correct}")
    ci = binomtest(int(correct), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def best_threshold(
    y_true: Sequence[int], scores: Sequence[float], metric: str = "f1", min_precision: float | None = None
) -> float:
    """The score threshold (predict 1 iff ``score >= threshold``) maximising ``metric``.

    Meant for tuning on a training split. Every distinct cut of the sorted scores is
    tried; the returned value is the midpoint between the lowest kept score and the next
    lower score, so it makes the same decisions on the training data but is not glued
    to one training example. "Keep everything" returns the minimum score, "keep nothing"
    the next float above the maximum. Ties between cuts go to the lowest threshold
    (keep more).

    Args:
        y_true: gold 0/1 labels (both classes must be present).
        scores: scores for class 1, higher = more likely relevant.
        metric: one of ``"f1"``, ``"accuracy"``, ``"balanced_accuracy"``.
        min_precision: only cuts whose precision reaches this are eligible (an operating point
            such as "precision >= 0.75"); when none does, the cut with the highest precision.

    >>> best_threshold([0, 0, 1, 1], [0.125, 0.5, 0.375, 0.875])  # keeps 0.875, 0.5, 0.375
    0.25
    >>> best_threshold([0, 0, 1, 1], [0.125, 0.5, 0.375, 0.875], min_precision=0.9)  # keeps only 0.875
    0.6875
    """
    if metric not in THRESHOLD_METRICS:
        raise RagsieveError(f"unknown threshold metric {metric!r}; use one of {THRESHOLD_METRICS}")
    true = _binary(y_true, "y_true")
    score = _scores(scores, "scores", true.size)
    n_pos = int(true.sum())
    n_neg = int(true.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        raise DataError(
            f"cannot tune a threshold on a single class ({n_pos} positives, {n_neg} negatives)"
        )

    order = np.argsort(-score, kind="stable")
    s, y = score[order], true[order]
    # Cut j keeps everything up to the last copy of the j-th distinct score; cut 0 keeps nothing.
    last = np.r_[np.flatnonzero(np.diff(s) != 0), s.size - 1]
    tp = np.r_[0, np.cumsum(y)[last]].astype(np.float64)
    fp = np.r_[0, np.cumsum(1 - y)[last]].astype(np.float64)
    fn = n_pos - tp
    tn = n_neg - fp
    if metric == "f1":
        value = 2 * tp / (2 * tp + fp + fn)  # denominator >= n_pos > 0
    elif metric == "accuracy":
        value = (tp + tn) / true.size
    else:
        value = (tp / n_pos + tn / n_neg) / 2

    if min_precision is not None:
        kept = tp + fp
        precision = np.divide(tp, kept, out=np.zeros_like(tp), where=kept > 0)
        eligible = (precision >= min_precision) & (kept > 0)
        if not eligible.any():  # unreachable: the cuts with the highest precision
            eligible = (precision >= precision.max() - 1e-12) & (kept > 0)
        value = np.where(eligible, value, -np.inf)
    best = int(np.flatnonzero(value >= value.max() - 1e-12)[-1])
    if best == 0:
        return float(np.nextafter(s[0], np.inf))
    lowest_kept = last[best - 1]
    if lowest_kept == s.size - 1:
        return float(s[-1])
    return float((s[lowest_kept] + s[lowest_kept + 1]) / 2)


def plot_confusion_matrix(
    cm: Sequence[Sequence[int]], path: str | Path, title: str = "Confusion matrix"
) -> Path:
    """Write a 2x2 confusion matrix ``[[tn, fp], [fn, tp]]`` as a PNG; returns the path.

    Uses matplotlib's Agg canvas directly (no pyplot), so the process-wide backend
    is left alone.

    >>> plot_confusion_matrix([[50, 3], [7, 40]], "out/cm.png", "judge on SciFact")  # doctest: +SKIP
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    matrix = np.asarray(cm, dtype=np.int64)
    if matrix.shape != (2, 2):
        raise DataError(f"confusion matrix must be 2x2 [[tn, fp], [fn, tp]], got shape {matrix.shape}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    fig = Figure(figsize=(4, 3.6), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    im = ax.imshow(matrix, cmap="Blues", vmin=0)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    total = max(int(matrix.sum()), 1)
    threshold = matrix.max() / 2
    for i in range(2):
        for j in range(2):
            ax.text(
                j, i, f"{matrix[i, j]}\n{matrix[i, j] / total:.1%}",
                ha="center", va="center",
                color="white" if matrix[i, j] > threshold else "black",
            )
    ax.set_xticks([0, 1], labels=["0 (drop)", "1 (keep)"])
    ax.set_yticks([0, 1], labels=["0", "1"])
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path
