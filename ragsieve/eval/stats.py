"""Statistics that travel with every result: intervals, paired tests, and what a difference means.

Every metric ragsieve reports carries n and a 95 % interval; every claim that one method
beats another on the same examples carries a paired test. A difference whose interval
covers 0 (or whose p ≥ 0.05) is reported as "no measurable difference", never as a win.

Every bootstrap here resamples the unit that was sampled. Where several examples share a query
(5 retrieved pairs per query, 300 test sentences from 61 questions), pass ``groups=`` (the query
id of each example): whole queries are then resampled together (a cluster bootstrap), since a
query's examples are not independent and resampling them one by one makes the interval too narrow.

* :func:`bootstrap_ci` — percentile bootstrap interval of any per-example metric (MRR, nDCG, F1, ...);
* :func:`bootstrap_metric` — the same for a metric of several aligned arrays (AUROC, precision, ...);
* :func:`paired_bootstrap` — the difference of two methods on the same examples, its interval and p;
* :func:`proportion_interval` — an accuracy's interval: Wilson for independent examples, else by query;
* :func:`conservative_query_interval` — an accuracy's interval by query when only the count right and the
  queries' sizes are known (no per-example outcomes to bootstrap): Wilson at the worst-case effective n;
* :func:`mcnemar_exact` — the exact McNemar test for two classifiers' right/wrong on the same examples;
* :func:`verdict` — the words a README uses for a paired difference ("no measurable difference" for p ≥ 0.05);
* :func:`target_verdict` / :func:`family_verdict` — the words a README uses for a target: "met" only when
  the 95 % interval clears it, "met at the point estimate, not shown" when it straddles, else "missed";
* :func:`non_inferior` / :func:`margin_verdict` — "as good as" only at a stated margin δ: the lower bound of
  the paired difference's interval (:func:`paired_proportion_difference`, Newcombe's) must clear −δ;
* :func:`detectable_difference` / :func:`questions_needed` — what a paired comparison of n examples can show;
* :func:`holm` — Holm's step-down adjustment of a family of p-values (several tests on one test set);
* :func:`auroc_interval` / :func:`auroc_difference` — AUROC and a paired AUROC difference, bootstrapped
  over whole groups (questions), since a question's examples are not independent.

Example::

    >>> import numpy as np
    >>> a = np.array([1, 1, 1, 0, 1, 1, 0, 1, 1, 1]); b = np.array([1, 0, 0, 0, 1, 0, 0, 1, 0, 1])
    >>> r = mcnemar_exact(a, b)
    >>> (r.a_only, r.b_only, round(r.p_value, 3))
    (4, 0, 0.125)
    >>> verdict(r.p_value, r.a_only - r.b_only)
    'no measurable difference'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ragsieve.errors import DataError

MetricFn = Callable[[np.ndarray], float]


def _as_matrix(values: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or len(arr) == 0:
        raise DataError(f"need a non-empty 1-d array of per-example values, got shape {arr.shape}")
    return arr


def _check_groups(groups: Sequence[Any] | np.ndarray, n: int) -> np.ndarray:
    g = np.asarray(groups)
    if g.ndim != 1 or len(g) != n:
        raise DataError(f"groups must give one query id per example: {len(g)} for {n} examples")
    return g


def bootstrap_rows(n: int, groups: Sequence[Any] | np.ndarray | None, n_boot: int,
                   rng: np.random.Generator) -> list[np.ndarray]:
    """The row indices of ``n_boot`` bootstrap resamples of ``n`` examples: examples drawn one by one
    (``groups=None``), or whole groups (queries) drawn with replacement, each bringing all its rows.

    Every bootstrap in this module draws through here, so each one resamples the same unit.

    Example::

        >>> rows = bootstrap_rows(4, ["q1", "q1", "q2", "q3"], 2, np.random.default_rng(0))
        >>> all(set(r[:2].tolist()) <= {0, 1, 2, 3} for r in rows)
        True
    """
    if groups is None:
        return list(rng.integers(0, n, size=(n_boot, n)))
    members = _group_rows(_check_groups(groups, n))
    picks = rng.integers(0, len(members), size=(n_boot, len(members)))
    return [np.concatenate([members[k] for k in pick]) for pick in picks]


def _bootstrap_means(columns: Sequence[np.ndarray], groups: Sequence[Any] | np.ndarray, n_boot: int,
                     rng: np.random.Generator) -> list[np.ndarray]:
    """The mean of each column over the resamples :func:`bootstrap_rows` draws (the same draws), from
    per-group sums: the fast path of the cluster bootstrap of a mean."""
    codes = np.unique(np.asarray(groups), return_inverse=True)[1]
    counts = np.bincount(codes).astype(np.float64)
    picks = rng.integers(0, len(counts), size=(n_boot, len(counts)))
    sizes = counts[picks].sum(axis=1)
    return [np.bincount(codes, weights=c)[picks].sum(axis=1) / sizes for c in columns]


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    statistic: MetricFn = np.mean,
    *,
    groups: Sequence[Any] | np.ndarray | None = None,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(estimate, low, high)``: the statistic of per-example ``values`` and its percentile bootstrap interval
    (resampling whole ``groups``, e.g. the query of each example, when given).

    Example::

        >>> est, lo, hi = bootstrap_ci([1.0, 0.5, 0.0, 1.0, 0.333], n_boot=500)
        >>> round(est, 3), lo < est < hi
        (0.567, True)
        >>> by_query = bootstrap_ci([1, 1, 1, 0, 0, 0], groups=["a", "a", "a", "b", "b", "b"], n_boot=500)
        >>> sorted({by_query[1], by_query[2]})  # a resample holds query a or b whole, or both
        [0.0, 1.0]
    """
    x = _as_matrix(values)
    rng = np.random.default_rng(seed)
    if groups is None:
        idx = rng.integers(0, len(x), size=(n_boot, len(x)))
        stats = np.array([statistic(x[row]) for row in idx]) if statistic is not np.mean else x[idx].mean(axis=1)
    elif statistic is np.mean:
        _check_groups(groups, len(x))
        (stats,) = _bootstrap_means([x], groups, n_boot, rng)
    else:
        stats = np.array([statistic(x[row]) for row in bootstrap_rows(len(x), groups, n_boot, rng)])
    alpha = (1 - confidence) / 2
    return float(statistic(x)), float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))


@dataclass(frozen=True)
class PairedDifference:
    """Method A minus method B on the same n examples, with its bootstrap interval and two-sided p."""

    n: int
    a: float
    b: float
    diff: float
    low: float
    high: float
    p_value: float

    @property
    def verdict(self) -> str:
        return verdict(self.p_value, self.diff, self.low, self.high)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}


def paired_bootstrap(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    statistic: MetricFn = np.mean,
    *,
    groups: Sequence[Any] | np.ndarray | None = None,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedDifference:
    """Paired bootstrap of ``statistic(a) - statistic(b)`` over examples resampled together
    (whole ``groups``, e.g. queries, when given).

    ``p_value`` is the two-sided share of resampled differences on the other side of 0
    (doubled, capped at 1): the usual paired bootstrap test for IR metrics.
    """
    x, y = _as_matrix(a), _as_matrix(b)
    if len(x) != len(y):
        raise DataError(f"paired values need the same examples: {len(x)} vs {len(y)}")
    rng = np.random.default_rng(seed)
    if groups is None:
        idx = rng.integers(0, len(x), size=(n_boot, len(x)))
        if statistic is np.mean:
            diffs = x[idx].mean(axis=1) - y[idx].mean(axis=1)
        else:
            diffs = np.array([statistic(x[row]) - statistic(y[row]) for row in idx])
    elif statistic is np.mean:
        _check_groups(groups, len(x))
        mean_x, mean_y = _bootstrap_means([x, y], groups, n_boot, rng)
        diffs = mean_x - mean_y
    else:
        diffs = np.array([statistic(x[row]) - statistic(y[row]) for row in bootstrap_rows(len(x), groups, n_boot, rng)])
    observed = float(statistic(x) - statistic(y))
    alpha = (1 - confidence) / 2
    if observed > 0:
        p = 2 * float(np.mean(diffs <= 0))
    elif observed < 0:
        p = 2 * float(np.mean(diffs >= 0))
    else:
        p = 1.0
    return PairedDifference(
        n=len(x), a=float(statistic(x)), b=float(statistic(y)), diff=observed,
        low=float(np.quantile(diffs, alpha)), high=float(np.quantile(diffs, 1 - alpha)), p_value=min(1.0, p),
    )


@dataclass(frozen=True)
class McNemarResult:
    """Exact McNemar: of the examples the two methods disagree on, how many each got right."""

    n: int
    a_correct: int
    b_correct: int
    a_only: int  # A right, B wrong
    b_only: int  # B right, A wrong
    p_value: float

    @property
    def diff(self) -> float:
        """Accuracy of A minus accuracy of B."""
        return (self.a_only - self.b_only) / self.n

    @property
    def verdict(self) -> str:
        return verdict(self.p_value, self.diff)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "diff": self.diff, "verdict": self.verdict}


def mcnemar_exact(correct_a: Sequence[int] | np.ndarray, correct_b: Sequence[int] | np.ndarray) -> McNemarResult:
    """Exact (binomial) McNemar test on paired right/wrong outcomes (scipy ``binomtest``)."""
    from scipy.stats import binomtest

    a = np.asarray(correct_a).astype(bool)
    b = np.asarray(correct_b).astype(bool)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise DataError(f"McNemar needs two equal-length outcome vectors, got {a.shape} and {b.shape}")
    a_only, b_only = int(np.sum(a & ~b)), int(np.sum(~a & b))
    p = 1.0 if a_only + b_only == 0 else float(binomtest(a_only, a_only + b_only, 0.5).pvalue)
    return McNemarResult(len(a), int(a.sum()), int(b.sum()), a_only, b_only, p)


NO_DIFFERENCE = "no measurable difference"
MET = "met"
MET_AT_POINT = "met at the point estimate, not shown"
MISSED = "missed"


def verdict(p_value: float, diff: float, low: float | None = None, high: float | None = None,
            alpha: float = 0.05) -> str:
    """The paired verdict: "A better" / "B better" only when the test says so (p < 0.05 and an interval
    clear of 0); otherwise "no measurable difference"."""
    if p_value >= alpha or (low is not None and high is not None and low <= 0 <= high) or diff == 0:
        return NO_DIFFERENCE
    return "A better" if diff > 0 else "B better"


def verdict_in_words(paired_verdict: str, a: str = "the sieve") -> str:
    """A :func:`verdict` said of method ``a``: "the sieve is better" / "the sieve is worse" / "no measurable
    difference"."""
    return {"A better": f"{a} is better", "B better": f"{a} is worse"}.get(paired_verdict, paired_verdict)


def target_verdict(estimate: float, low: float | None, high: float | None, target: float,
                   higher_is_better: bool = True) -> str:
    """The verdict on a target (``estimate >= target``, or ``<=`` with ``higher_is_better=False``):

    * "met" only when the whole 95 % interval clears the target;
    * "met at the point estimate, not shown" when the estimate meets it but the interval straddles it;
    * "missed" when the estimate misses it (an interval wholly on the wrong side included).

    Example::

        >>> target_verdict(0.643, 0.58, 0.70, 0.60), target_verdict(0.667, 0.61, 0.72, 0.60)
        ('met at the point estimate, not shown', 'met')
        >>> target_verdict(-0.014, -0.048, 0.018, -0.01)
        'missed'
    """
    sign = 1.0 if higher_is_better else -1.0
    if sign * (estimate - target) < 0:
        return MISSED
    bound = low if higher_is_better else high
    return MET if bound is not None and sign * (bound - target) >= 0 else MET_AT_POINT


def family_verdict(verdicts: Sequence[str], needed: int | None = None) -> str:
    """A target over several datasets ("on 4 of 6", or all of them when ``needed`` is None): "met" when at
    least ``needed`` are met, "met at the point estimate, not shown" when enough are met at least at the
    point estimate, else "missed".

    >>> family_verdict(["met", "met", "met at the point estimate, not shown", "missed"], needed=3)
    'met at the point estimate, not shown'
    """
    needed = len(verdicts) if needed is None else needed
    if not verdicts or sum(v == MET for v in verdicts) >= needed:
        return MET if verdicts else MISSED
    return MET_AT_POINT if sum(v in (MET, MET_AT_POINT) for v in verdicts) >= needed else MISSED


def proportion_interval(correct: Sequence[int] | np.ndarray, groups: Sequence[Any] | np.ndarray | None = None,
                        *, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """``(accuracy, low, high)`` of right/wrong outcomes: the Wilson interval when every example is its own
    query (``groups`` None or all distinct), else the bootstrap over whole queries.

    Example::

        >>> acc, lo, hi = proportion_interval([1, 1, 0, 0, 1, 1], groups=["a", "a", "b", "b", "c", "c"])
        >>> round(acc, 3), round(lo, 3), round(hi, 3)
        (0.667, 0.0, 1.0)
    """
    from ragsieve.eval.classification import accuracy_interval

    x = _as_matrix(correct)
    if groups is None or len(set(np.asarray(groups).tolist())) == len(x):
        low, high = accuracy_interval(int(x.sum()), len(x))
        return float(x.mean()), low, high
    return bootstrap_ci(x, groups=groups, n_boot=n_boot, seed=seed)


def worst_case_design_effect(cluster_sizes: Sequence[int]) -> float:
    """Kish's design effect of a mean over n = Σ m_i examples in queries of sizes m_i when the examples of a
    query are perfectly correlated (intra-query correlation 1): Σ m_i² / n, the most the variance can grow.

    >>> worst_case_design_effect([1, 1, 1]), worst_case_design_effect([2, 1, 1])
    (1.0, 1.5)
    """
    sizes = np.asarray(cluster_sizes, dtype=np.float64)
    if sizes.ndim != 1 or len(sizes) == 0 or (sizes < 1).any():
        raise DataError(f"need one size >= 1 per query, got {list(cluster_sizes)}")
    return float((sizes ** 2).sum() / sizes.sum())


def conservative_query_interval(correct: int, cluster_sizes: Sequence[int],
                                confidence: float = 0.95) -> tuple[float, float, float]:
    """``(accuracy, low, high)`` of ``correct`` right out of n = Σ m_i examples from queries of sizes m_i,
    when each example's outcome is unknown so whole queries cannot be resampled: the Wilson interval at
    Kish's effective n = n / deff, with the worst-case deff (:func:`worst_case_design_effect`).

    Wilson at the effective n rather than a Wald interval widened by √deff: it is exactly the Wilson
    interval when every query holds one example, and it stays inside [0, 1] without clipping and keeps its
    coverage near 0 or 1 (the clip guards rounding only). Conservative: whatever the intra-query correlation
    (at most 1), its design effect is at most this one.

    >>> [round(x, 3) for x in conservative_query_interval(12, [1] * 24)]  # one example per query: Wilson
    [0.5, 0.314, 0.686]
    >>> [round(x, 3) for x in conservative_query_interval(12, [2] * 12)]  # pairs: Wilson at n = 12
    [0.5, 0.254, 0.746]
    """
    from scipy.stats import norm

    n = int(np.sum(cluster_sizes))
    if not 0 <= correct <= n:
        raise DataError(f"correct must lie in [0, {n}], got {correct}")
    n_eff = n / worst_case_design_effect(cluster_sizes)
    p, z = correct / n, float(norm.ppf(0.5 + confidence / 2))
    center = (p + z * z / (2 * n_eff)) / (1 + z * z / n_eff)
    half = z * np.sqrt(p * (1 - p) / n_eff + z * z / (4 * n_eff * n_eff)) / (1 + z * z / n_eff)
    return p, float(max(0.0, center - half)), float(min(1.0, center + half))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input order: controls the chance of any false "A better" in the family.

    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
    """
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))  # step-down: never below a smaller p's
        adjusted[i] = round(running, 12)
    return adjusted


def bootstrap_metric(
    metric: Callable[..., float],
    *arrays: Sequence[Any] | np.ndarray,
    groups: Sequence[Any] | np.ndarray | None = None,
    n_boot: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(estimate, low, high)`` of a metric over several aligned arrays resampled together (AUROC, F1, ...);
    with ``groups`` (the query of each row), whole queries are resampled.

    Resamples where the metric is undefined (e.g. one class only) are skipped.

    Example::

        from sklearn.metrics import roc_auc_score
        bootstrap_metric(roc_auc_score, labels, scores)
    """
    data = [np.asarray(a) for a in arrays]
    n = len(data[0])
    if n == 0 or any(len(a) != n for a in data):
        raise DataError("bootstrap_metric needs non-empty arrays of one length")
    rng = np.random.default_rng(seed)
    stats = []
    for row in bootstrap_rows(n, groups, n_boot, rng):
        try:
            value = float(metric(*(a[row] for a in data)))
        except ValueError:  # undefined on this resample
            continue
        if np.isfinite(value):  # scikit-learn ≥ 1.8 returns nan (with a warning) instead of raising
            stats.append(value)
    estimate = float(metric(*data))
    if not stats:
        return estimate, float("nan"), float("nan")
    alpha = (1 - confidence) / 2
    return estimate, float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))


def relative_mean_change(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *, n_boot: int = 2000,
                         seed: int = 0) -> dict[str, Any]:
    """Means of A and B on the same units (questions) and A's relative change (``-0.3``: 30 % less), with a
    bootstrap 95 % interval that resamples units (A's and B's value of a unit together).

    Example::

        relative_mean_change(sieve_prompt_tokens, plain_prompt_tokens)["ci95"]   # e.g. [-0.21, -0.15]
    """
    x, y = np.asarray(a, float), np.asarray(b, float)
    est, lo, hi = bootstrap_metric(lambda u, v: float(u.mean() / max(v.mean(), 1e-9) - 1), x, y, n_boot=n_boot,
                                   seed=seed)
    return {"n": len(x), "a": float(x.mean()), "b": float(y.mean()), "change": est, "ci95": [lo, hi]}


def _group_rows(groups: np.ndarray) -> list[np.ndarray]:
    """The row indices of each group (question), for bootstraps that resample whole groups."""
    _, inverse = np.unique(groups, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    return np.split(order, np.cumsum(np.bincount(inverse))[:-1])


def rank_auroc(labels: np.ndarray, scores: np.ndarray) -> float:
    """AUROC as the Mann–Whitney U statistic (ties count one half): the value of sklearn's
    ``roc_auc_score``, ≈ 20× faster, for the bootstrap loops below (a study report resamples
    thousands of times). Two AUROCs of the same rows differ by exactly 0 when their U's are equal.

    Example::

        >>> float(rank_auroc(np.array([0, 1, 0, 1]), np.array([.1, .9, .5, .5])))
        0.875
    """
    from scipy.stats import rankdata

    positive = np.asarray(labels) == 1
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if not n_pos or not n_neg:
        raise ValueError("AUROC needs both classes")  # as roc_auc_score: undefined, not 0.5
    u = rankdata(scores)[positive].sum() - n_pos * (n_pos + 1) / 2
    return u / (n_pos * n_neg)


def weighted_aurocs(labels: np.ndarray, scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """:func:`rank_auroc` of many resamples at once: ``weights[b, i]`` is how often row ``i`` is in resample ``b``
    (a bootstrap draws rows with repeats), and each resample's AUROC is the weighted Mann–Whitney U (ties one
    half) — the value ``rank_auroc`` gives that resample's rows, in one pass over the rows sorted by score
    instead of a ranking per resample. NaN for a resample without both classes.

    Example::

        >>> y, s = np.array([0, 1, 0, 1]), np.array([.1, .9, .5, .5])
        >>> weighted_aurocs(y, s, np.array([[1., 1, 1, 1], [0, 1, 2, 1]])).round(3).tolist()
        [0.875, 0.75]
    """
    positive = np.asarray(labels) == 1
    levels, level_of = np.unique(np.asarray(scores, dtype=np.float64), return_inverse=True)
    weights = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    pos = np.zeros((len(weights), len(levels)))
    neg = np.zeros_like(pos)
    np.add.at(pos.T, level_of[positive], weights[:, positive].T)
    np.add.at(neg.T, level_of[~positive], weights[:, ~positive].T)
    below = np.cumsum(neg, axis=1) - neg  # negatives scoring strictly lower, per level
    u = (pos * (below + 0.5 * neg)).sum(axis=1)
    n_pos, n_neg = pos.sum(axis=1), neg.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n_pos > 0) & (n_neg > 0), u / (n_pos * n_neg), np.nan)


def auroc_interval(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray, n_boot: int, seed: int = 0) -> dict:
    """AUROC with a 95 % bootstrap interval that resamples ``groups`` (questions) whole.

    A question's prompts share what the model knows about it, so resampling prompts
    one by one would make the interval too narrow. ``n_boot = 0`` gives the point only.

    Example::

        >>> y = np.array([0, 1, 0, 1, 0, 1]); s = np.array([.1, .9, .2, .8, .7, .3])
        >>> r = auroc_interval(y, s, np.array([0, 0, 1, 1, 2, 2]), n_boot=200)
        >>> round(r["auroc"], 3), r["positives"], r["low"] <= r["auroc"] <= r["high"]
        (0.889, 3, True)
    """
    labels, scores, groups = np.asarray(labels), np.asarray(scores), np.asarray(groups)
    out = {"auroc": None, "low": None, "high": None, "n": int(len(labels)), "positives": int(labels.sum())}
    if len(labels) == 0 or len(set(labels.tolist())) < 2:
        return out
    out["auroc"] = float(rank_auroc(labels, scores))
    if n_boot <= 0:
        return out
    rows = bootstrap_rows(len(labels), groups, n_boot, np.random.default_rng(seed))  # bootstrap_metric's draws
    values = weighted_aurocs(labels, scores, _row_weights(rows, len(labels)))
    values = values[np.isfinite(values)]  # a resample with one class only has none
    if len(values):  # none: leave None
        out["low"], out["high"] = float(np.quantile(values, 0.025)), float(np.quantile(values, 0.975))
    return out


def _row_weights(rows: Sequence[np.ndarray], n: int) -> np.ndarray:
    """How often each of ``n`` rows is in each resample (one row of weights a resample)."""
    return np.stack([np.bincount(r, minlength=n) for r in rows]).astype(np.float64)


def auroc_difference(labels: np.ndarray, scores_a: np.ndarray, scores_b: np.ndarray, groups: np.ndarray,
                     n_boot: int, seed: int = 0) -> dict:
    """AUROC(a) − AUROC(b) on the same prompts, with a paired bootstrap over whole ``groups``.

    ``p_value`` is two-sided: twice the share of resampled differences on the other side of 0.

    Example::

        >>> y = np.array([0, 1, 0, 1, 0, 1]); g = np.array([0, 0, 1, 1, 2, 2])
        >>> r = auroc_difference(y, np.array([.1, .9, .2, .8, .3, .7]), np.array([.9, .1, .2, .8, .3, .7]), g, 200)
        >>> round(r["diff"], 3), r["p_value"] <= 1
        (0.556, True)
    """
    labels, a, b, groups = map(np.asarray, (labels, scores_a, scores_b, groups))
    out = {"n": int(len(labels)), "positives": int(labels.sum()), "a": None, "b": None, "diff": None,
           "low": None, "high": None, "p_value": None}
    if len(set(labels.tolist())) < 2:
        return out
    out["a"], out["b"] = float(rank_auroc(labels, a)), float(rank_auroc(labels, b))
    out["diff"] = out["a"] - out["b"]
    if n_boot <= 0:
        return out
    weights = _row_weights(bootstrap_rows(len(labels), groups, n_boot, np.random.default_rng(seed)), len(labels))
    d = weighted_aurocs(labels, a, weights) - weighted_aurocs(labels, b, weights)
    d = d[np.isfinite(d)]  # undefined on a one-class resample
    if len(d):
        out["low"], out["high"] = float(np.quantile(d, 0.025)), float(np.quantile(d, 0.975))
        side = d <= 0 if out["diff"] > 0 else d >= 0
        out["p_value"] = 1.0 if out["diff"] == 0 else min(1.0, 2 * float(side.mean()))
    return out


# -- "as good as": non-inferiority at a stated margin --------------------------------------------------------

#: the margin ``fit`` and the studies judge "as good as" by unless told otherwise (accuracy points); see
#: :class:`ragsieve.fit.config.SelectConfig.margin` for why 2 points
DEFAULT_MARGIN = 0.02


def paired_proportion_difference(both: int, a_only: int, b_only: int, neither: int, confidence: float = 0.95
                                 ) -> tuple[float, float, float]:
    """``(diff, low, high)``: A's accuracy minus B's on the same examples, with Newcombe's hybrid score
    interval for paired proportions (Newcombe 1998, method 10: Wilson intervals of each accuracy, combined
    with the paired outcomes' correlation). Unlike a bootstrap, it does not shrink to [0, 0] when the two
    methods agree on every one of a few examples: 29 agreeing questions (6 right) still leave ±7 points.

    Example (Newcombe's worked example: 36 both right, 12 A only, 2 B only, 0 neither)::

        >>> [round(x, 4) for x in paired_proportion_difference(36, 12, 2, 0)]
        [0.2, 0.0569, 0.3404]
    """
    from scipy.stats import binomtest

    n = both + a_only + b_only + neither
    if n <= 0 or min(both, a_only, b_only, neither) < 0:
        raise DataError(f"a paired difference needs non-negative counts and at least one example, got "
                        f"{(both, a_only, b_only, neither)}")
    right_a, right_b = both + a_only, both + b_only
    p_a, p_b = right_a / n, right_b / n

    def wilson(k: int) -> tuple[float, float]:
        ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
        return float(ci.low), float(ci.high)

    (low_a, high_a), (low_b, high_b) = wilson(right_a), wilson(right_b)
    margins = (right_a * (n - right_a) * right_b * (n - right_b))
    phi = 0.0 if margins == 0 else (both * neither - a_only * b_only) / np.sqrt(margins)
    below = np.sqrt(max((p_a - low_a) ** 2 - 2 * phi * (p_a - low_a) * (high_b - p_b) + (high_b - p_b) ** 2, 0.0))
    above = np.sqrt(max((high_a - p_a) ** 2 - 2 * phi * (high_a - p_a) * (p_b - low_b) + (p_b - low_b) ** 2, 0.0))
    diff = p_a - p_b
    return float(diff), float(max(diff - below, -1.0)), float(min(diff + above, 1.0))


NON_INFERIOR = "non-inferior"
UNDECIDED = "undecided"
INFERIOR = "worse by more than the margin"


def margin_verdict(low: float, high: float, margin: float) -> str:
    """The words for A against B at margin δ (accuracy points), from the 95 % interval of A − B:
    "non-inferior at δ = 2 pp" when the lower bound clears −δ, "worse by more than the margin (δ = 2 pp)" when
    the upper bound is below −δ, else "undecided at δ = 2 pp" (the data cannot tell).

    >>> margin_verdict(-0.012, +0.031, 0.02), margin_verdict(-0.056, 0.031, 0.02)
    ('non-inferior at δ = 2 pp', 'undecided at δ = 2 pp')
    """
    points = f"δ = {margin * 100:g} pp"
    if low > -margin:
        return f"{NON_INFERIOR} at {points}"
    if high < -margin:
        return f"{INFERIOR} ({points})"
    return f"{UNDECIDED} at {points}"


@dataclass(frozen=True)
class NonInferiority:
    """A against B on the same examples at margin δ: the difference of accuracies with its 95 % interval
    (:func:`paired_proportion_difference`); ``shown`` when the lower bound clears −δ."""

    n: int
    a_correct: int
    b_correct: int
    a_only: int
    b_only: int
    diff: float
    low: float
    high: float
    margin: float

    @property
    def shown(self) -> bool:
        return self.low > -self.margin

    @property
    def verdict(self) -> str:
        return margin_verdict(self.low, self.high, self.margin)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ci95": [self.low, self.high], "non_inferior": self.shown, "verdict": self.verdict}


def non_inferior(correct_a: Sequence[int] | np.ndarray, correct_b: Sequence[int] | np.ndarray,
                 margin: float = DEFAULT_MARGIN, confidence: float = 0.95) -> NonInferiority:
    """Is A no more than ``margin`` less accurate than B, as far as these paired right/wrong outcomes show?
    "No measurable difference" is not "as good": a cheaper configuration is as good only when the interval's
    lower bound clears −δ (ICH E9 / CONSORT non-inferiority).

    Example::

        >>> non_inferior([0] * 5 + [1] + [0] * 23, [1] * 6 + [0] * 23).shown    # 1/29 vs 6/29: p = 0.06, not "as good"
        False
        >>> non_inferior([1] * 60 + [0] * 240, [1] * 60 + [0] * 240).verdict     # the same answers on 300 questions
        'non-inferior at δ = 2 pp'
    """
    a, b = np.asarray(correct_a).astype(bool), np.asarray(correct_b).astype(bool)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise DataError(f"non-inferiority needs two equal-length outcome vectors, got {a.shape} and {b.shape}")
    both, a_only, b_only = int(np.sum(a & b)), int(np.sum(a & ~b)), int(np.sum(~a & b))
    return non_inferior_counts(both, a_only, b_only, len(a) - both - a_only - b_only, margin, confidence)


def non_inferior_counts(both: int, a_only: int, b_only: int, neither: int, margin: float = DEFAULT_MARGIN,
                        confidence: float = 0.95) -> NonInferiority:
    """:func:`non_inferior` from the paired counts alone (a committed comparison that kept no per-question
    outcomes: its ``a_correct``, ``a_only``, ``b_only`` and ``n`` give them)."""
    diff, low, high = paired_proportion_difference(both, a_only, b_only, neither, confidence)
    return NonInferiority(both + a_only + b_only + neither, both + a_only, both + b_only, a_only, b_only, diff, low,
                          high, float(margin))


def detectable_difference(discordant: int, n: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest accuracy difference a paired comparison of ``n`` examples detects with ``power`` at
    two-sided ``alpha``, from the share of examples the two methods disagree on (Connor 1987's normal
    approximation of McNemar's power without its small δ² term, which errs large; the disagreement is
    smoothed by one example, so that a few agreeing examples do not promise a zero). It is also about the
    half-width a non-inferiority interval needs to clear a margin that size.

    >>> round(detectable_difference(5, 29), 3), round(detectable_difference(40, 500), 3)
    (0.233, 0.036)
    """
    from scipy.stats import norm

    if n <= 0:
        return 1.0
    share = (discordant + 1) / (n + 1)
    return float(min(1.0, (norm.ppf(1 - alpha / 2) + norm.ppf(power)) * np.sqrt(share / n)))


def questions_needed(discordant: int, n: int, margin: float, *, alpha: float = 0.05, power: float = 0.8) -> int:
    """How many paired examples would make :func:`detectable_difference` reach ``margin`` at the disagreement
    share seen in ``discordant`` of ``n``.

    >>> questions_needed(5, 29, 0.02)
    3925
    """
    from scipy.stats import norm

    share = (discordant + 1) / (n + 1) if n > 0 else 1.0
    return int(np.ceil((norm.ppf(1 - alpha / 2) + norm.ppf(power)) ** 2 * share / margin ** 2))
