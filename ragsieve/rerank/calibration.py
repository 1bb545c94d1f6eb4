"""Calibrated relevance probabilities: ``p = sigmoid(score / T + b)`` fitted on labelled dev pairs.

A ranker's raw score orders passages but means nothing on its own (a logit of 2.3, a cosine
of 0.41, a BM25 of 17). Temperature scaling with a bias (Platt scaling with one slope) keeps
the order and maps the score to the probability that the passage is relevant, fitted by
minimising the log-loss on held-aside labelled pairs. Scores that are already sigmoid
outputs (sentence-transformers cross-encoders) are mapped back to logits first.

**Choosing a threshold.** A calibrated probability of 0.8 means that, among dev pairs
scored about 0.8, about 80 % were relevant. Keeping passages with ``p >= t`` therefore
gives a precision of at least about ``t`` on data like the dev set; for a target precision
read the threshold off dev with :func:`threshold_for_precision` rather than trusting
``t`` alone, since precision above a threshold averages all scores above it (and is
usually higher than ``t``). Calibration is fitted on the dev mixture of datasets: on a
very different corpus refit it with a few hundred labelled pairs (``ranker.calibrate``).

Example::

    cal = Calibration.fit([2.0, -1.0, 0.5, -3.0], [1, 0, 1, 0])
    cal.proba([1.0])                     # array([0.9...])
    ranker.calibrate(pairs_queries, pairs_passages, labels); ranker.predict_proba(q, passages)
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError


class Calibration(StrictConfig):
    """``p = sigmoid(x / temperature + bias)`` with ``x`` the score (as a logit if ``from_probability``)."""

    temperature: float = 1.0
    bias: float = 0.0
    from_probability: bool = False  # the scores are sigmoid outputs: fit on their logits

    @classmethod
    def fit(cls, scores: Sequence[float], labels: Sequence[int], from_probability: bool = False,
            platt_targets: bool = False) -> "Calibration":
        """Minimise the mean log-loss of ``sigmoid(x / T + b)`` over (score, label) pairs.

        ``platt_targets``: fit to Platt's (1999) targets ``(N+ + 1) / (N+ + 2)`` and ``1 / (N- + 2)`` instead of
        1 and 0, so a small or perfectly separated set (a user's few labelled queries) gives a finite slope
        rather than probabilities of exactly 0 and 1."""
        from scipy.optimize import minimize

        x = as_logits(np.asarray(scores, dtype=float), from_probability)
        y = np.asarray(labels, dtype=float)
        if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
            raise RagsieveError(f"calibration needs matching 1-d scores and labels (got {x.shape} and {y.shape})")
        if not set(np.unique(y)) <= {0.0, 1.0} or len(np.unique(y)) < 2:
            raise RagsieveError("calibration labels must be 0/1 and contain both classes")

        if platt_targets:
            positives = float(y.sum())
            y = np.where(y > 0, (positives + 1) / (positives + 2), 1.0 / (len(y) - positives + 2))

        def loss(params: np.ndarray) -> float:
            z = x * params[0] + params[1]  # params[0] = 1 / T, so the optimum is never at a pole
            return float(np.mean(np.logaddexp(0.0, z) - y * z))

        res = minimize(loss, np.array([1.0 / max(np.std(x), 1e-6), 0.0]), method="Nelder-Mead",
                       options={"xatol": 1e-6, "fatol": 1e-9, "maxiter": 2000})
        inv_t, bias = res.x
        if inv_t <= 0:
            raise RagsieveError("scores are anti-correlated with the labels: no positive temperature fits")
        return cls(temperature=float(1.0 / inv_t), bias=float(bias), from_probability=from_probability)

    def proba(self, scores: Sequence[float]) -> np.ndarray:
        from scipy.special import expit

        x = as_logits(np.asarray(scores, dtype=float), self.from_probability)
        return expit(x / self.temperature + self.bias)

    def score_at(self, proba: Sequence[float]) -> np.ndarray:
        """The inverse of :meth:`proba`: the score whose probability is ``proba`` (a sigmoid output again
        if ``from_probability``; 0 and 1 map to the ends of the score range, ±inf for logits).

        Example::

            cal = Calibration(temperature=2.0, bias=-1.0)
            cal.score_at(cal.proba([3.0]))          # array([3.])
        """
        from scipy.special import expit, logit

        z = (logit(np.asarray(proba, dtype=float)) - self.bias) * self.temperature
        return expit(z) if self.from_probability else z


class CalibrationFile(StrictConfig):
    """A calibration fitted on a user's labelled pairs for one reranker: what ``ragsieve rerank calibrate``
    writes and ``load_reranker(spec, calibration=path)`` / ``ragsieve serve --calibration`` apply.

    ``reranker`` and ``ranker_weights`` name the scores it was fitted on (a calibration is a map of one
    model's score scale: on other weights it means nothing, so it is refused there). ``ece`` holds the
    reranker's ECE on these pairs as loaded (its shipped calibration, or the logistic of a raw score) and
    with this calibration, cross-fitted (each query's pairs mapped by a calibration fitted without that
    query), each ``{mean, low, high}`` over ``queries`` resampled whole.
    """

    reranker: str
    ranker_weights: str | None = None
    calibration: Calibration
    pairs: int
    queries: int
    relevant: int
    folds: int
    n_bins: int = 10
    ece: dict[str, dict[str, float]] = {}
    # target precision → the [0, 1] cut reaching it on the cross-fitted probabilities (None: none does), its recall
    thresholds: dict[str, dict[str, float | None]] = {}

    def save(self, path: str | Path) -> Path:
        from ragsieve.atomic import atomic_file

        with atomic_file(path) as tmp:
            tmp.write_text(self.model_dump_json(indent=2) + "\n")
        return Path(path)


def fit_calibration(scores: Sequence[float], labels: Sequence[int], groups: Sequence[str], *,
                    from_probability: bool = False, as_loaded: Sequence[float] | None = None, folds: int = 5,
                    n_bins: int = 10, n_boot: int = 1000, seed: int = 0,
                    precisions: Sequence[float] = ()) -> tuple[Calibration, dict, dict]:
    """A calibration fitted on all (score, label) pairs (Platt's targets), and its ECE measured honestly:
    cross-fitted over ``folds`` folds of whole queries (``groups``: the query of each pair), with 95 % intervals
    resampling queries. ``as_loaded`` (the [0, 1] scores the ranker answered before) gets the same ECE for comparison.

    For each of ``precisions``, the lowest [0, 1] threshold whose precision on the cross-fitted probabilities
    reaches it (:func:`threshold_for_precision`), with the recall and the share of pairs kept there: the
    ``relevance_score`` cut to set in a client (Open WebUI's, Dify's) for that precision on data like these labels.

    Returns ``(calibration, {"calibrated_cross_fitted": {...}, "as_loaded": {...}}, {"0.8": {"threshold", "recall",
    "kept"}, ...})``; a fold whose training part holds one class only leaves its pairs out of the cross-fitted
    values (``pairs`` says how many were scored).

    Example::

        cal, ece, cuts = fit_calibration([2., -1., 1., -2.], [1, 0, 1, 0], ["a", "a", "b", "b"], folds=2,
                                         n_boot=10, precisions=[0.9])
    """
    from sklearn.model_selection import GroupKFold

    from ragsieve.eval.calibration import expected_calibration_error
    from ragsieve.eval.stats import bootstrap_metric

    x, y, g = np.asarray(scores, dtype=float), np.asarray(labels, dtype=int), np.asarray(groups)
    calibration = Calibration.fit(x, y, from_probability=from_probability, platt_targets=True)

    def ece(truth: np.ndarray, probs: np.ndarray) -> float:
        return expected_calibration_error(truth, probs, n_bins)

    def interval(probs: np.ndarray, keep: np.ndarray) -> dict[str, float]:
        est, low, high = bootstrap_metric(ece, y[keep], probs[keep], groups=g[keep], n_boot=n_boot, seed=seed)
        return {"mean": est, "low": low, "high": high, "pairs": int(keep.sum()), "queries": len(set(g[keep]))}

    out: dict[str, dict[str, float]] = {}
    cuts: dict[str, dict[str, float | None]] = {}
    splits = min(folds, len(set(g.tolist())))
    if splits >= 2:
        crossed = np.full(len(x), np.nan)
        for train, test in GroupKFold(n_splits=splits).split(x, y, g):
            try:
                crossed[test] = Calibration.fit(x[train], y[train], from_probability=from_probability,
                                                platt_targets=True).proba(x[test])
            except RagsieveError:  # this fold's training queries hold one class only
                continue
        scored = np.isfinite(crossed)
        if scored.any():
            out["calibrated_cross_fitted"] = interval(crossed, scored)
            p, truth = crossed[scored], y[scored]
            for target in precisions:
                t = threshold_for_precision(p, truth, target)
                kept = p >= t if t is not None else np.zeros(len(p), dtype=bool)
                cuts[f"{target:g}"] = {"threshold": t, "recall": float(truth[kept].sum() / max(truth.sum(), 1)),
                                       "kept": float(kept.mean())}
    if as_loaded is not None:
        out["as_loaded"] = interval(np.asarray(as_loaded, dtype=float), np.ones(len(x), dtype=bool))
    return calibration, out, cuts


def as_logits(x: np.ndarray, from_probability: bool) -> np.ndarray:
    """``x`` itself, or the logit of ``x`` when it holds sigmoid outputs (clipped to 1e-7 from 0 and 1)."""
    if not from_probability:
        return x
    p = np.clip(x, 1e-7, 1 - 1e-7)
    return np.log(p) - np.log1p(-p)


def threshold_for_precision(probs: Sequence[float], labels: Sequence[int], precision: float) -> float | None:
    """The lowest threshold whose precision on (probs, labels) is ≥ ``precision`` (None if none is).

    Example::

        threshold_for_precision([0.9, 0.8, 0.3], [1, 1, 0], 0.9)   # 0.8
    """
    p = np.asarray(probs, dtype=float)
    y = np.asarray(labels, dtype=int)
    order = np.argsort(-p, kind="stable")
    ranked = p[order]
    prec = np.cumsum(y[order]) / np.arange(1, len(p) + 1)
    # `p >= t` keeps every tie of t: only the last of a run of equal probabilities is a cut one can make
    cut = np.r_[ranked[1:] != ranked[:-1], True]
    ok = np.flatnonzero((prec >= precision) & cut)
    return float(ranked[ok[-1]]) if len(ok) else None
