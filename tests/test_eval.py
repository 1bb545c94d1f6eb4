"""Tests for ragsieve.eval against hand-computed values."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

from ragsieve.errors import DataError, RagsieveError
from ragsieve.eval import (
    best_threshold,
    calibration,
    classification,
    classification_metrics,
    contains_answer,
    exact_match,
    expected_calibration_error,
    normalize_answer,
    plot_confusion_matrix,
    plot_reliability_diagram,
    qa,
    qa_metrics,
    ranking,
    ranking_metrics,
    reliability_bins,
    run_from_rankings,
    token_f1,
)

# --------------------------------------------------------------------------- ranking

QRELS = {
    "q1": {"d1": 1, "d3": 1},
    "q2": {"d2": 2, "d4": 1},  # graded
    "q3": {"d9": 1},  # missing from the run -> 0 everywhere
}
RUN = {
    "q1": {"d1": 0.9, "d2": 0.8, "d3": 0.7},
    # d4 and d2 tie; d4 comes first in the dict, so the ranking is d5, d4, d2.
    "q2": {"d5": 0.9, "d4": 0.5, "d2": 0.5},
    "q4": {"d1": 1.0},  # no qrels -> ignored
}
L3 = 1 / math.log2(3)  # discount at rank 2 (rank 1 -> 1, rank 3 -> 1/log2(4) = 0.5)
# q1 ranking d1(rel 1) d2 d3(rel 1):
#   P@1 = 1, P@3 = 2/3, P@5 = 2/5 (P divides by k even past the 3 retrieved docs)
#   R@1 = 1/2, R@3 = R@5 = 1;  MRR = 1
#   nDCG@1 = 1;  nDCG@3 = nDCG@5 = (1 + 0.5) / (1 + L3)
# q2 ranking d5 d4(rel 1) d2(rel 2):
#   P@1 = 0, P@3 = 2/3, P@5 = 2/5;  R@1 = 0, R@3 = R@5 = 1;  MRR@1 = 0, MRR@3 = MRR@5 = 1/2
#   nDCG@1 = 0;  nDCG@3 = nDCG@5 = (L3 * 1 + 0.5 * 2) / (2 + L3 * 1)   (linear gain)
# q3: all 0.  Means are over 3 queries.
Q1_NDCG3 = 1.5 / (1 + L3)
Q2_NDCG3 = (L3 + 1) / (2 + L3)
EXPECTED = {
    "P@1": 1 / 3,
    "P@3": (2 / 3 + 2 / 3) / 3,
    "P@5": (2 / 5 + 2 / 5) / 3,
    "R@1": 0.5 / 3,
    "R@3": 2 / 3,
    "R@5": 2 / 3,
    "MRR@1": 1 / 3,
    "MRR@3": 1.5 / 3,
    "MRR@5": 1.5 / 3,
    "nDCG@1": 1 / 3,
    "nDCG@3": (Q1_NDCG3 + Q2_NDCG3) / 3,
    "nDCG@5": (Q1_NDCG3 + Q2_NDCG3) / 3,
}


def test_ranking_metrics_hand_values():
    got = ranking_metrics(QRELS, RUN, ks=(1, 3, 5))
    assert list(got) == list(EXPECTED)  # measures outer, ks inner
    for name, value in EXPECTED.items():
        assert got[name] == pytest.approx(value, abs=1e-9), name
    assert Q1_NDCG3 == pytest.approx(0.919721, abs=1e-6)
    assert Q2_NDCG3 == pytest.approx(0.619906, abs=1e-6)


def test_ranking_metrics_per_query_and_missing_query():
    got = ranking_metrics(QRELS, RUN, ks=(3,), measures=("MRR", "nDCG"), per_query=True)
    assert list(got["MRR@3"]) == ["q1", "q2", "q3"]  # qrels order, q4 dropped
    assert got["MRR@3"] == {"q1": 1.0, "q2": 0.5, "q3": 0.0}
    assert got["nDCG@3"]["q2"] == pytest.approx(Q2_NDCG3)
    # A run with no query from qrels at all: everything is 0, not an error.
    assert ranking_metrics(QRELS, {}, ks=(1,), measures=("P",)) == {"P@1": 0.0}


def test_ranking_ties_follow_input_order():
    # Same scores, d2 listed before d4: ranking d5, d2(rel 2), d4(rel 1).
    swapped = {"q2": {"d5": 0.9, "d2": 0.5, "d4": 0.5}}
    got = ranking_metrics({"q2": QRELS["q2"]}, swapped, ks=(3,), measures=("nDCG",))
    # DCG = 2 * L3 + 1 * 0.5; IDCG = 2 + L3
    assert got["nDCG@3"] == pytest.approx((2 * L3 + 0.5) / (2 + L3))
    # 30 tied docs: the relevant one is ranked where it sits in the list.
    ranked = run_from_rankings({"q": [(f"d{i}", 0.5) for i in range(30)]})
    for pos in (0, 5, 29):
        rr = ranking_metrics({"q": {f"d{pos}": 1}}, ranked, ks=(30,), measures=("MRR",))
        assert rr["MRR@30"] == pytest.approx(1 / (pos + 1))


def test_ranking_edge_cases():
    # A query with no relevant document scores 0 and counts in the mean.
    got = ranking_metrics({"a": {"d1": 1}, "b": {"d1": 0}}, {"a": {"d1": 1.0}, "b": {"d1": 1.0}},
                          ks=(1,), measures=("P", "R"))
    assert got == {"P@1": 0.5, "R@1": 0.5}
    with pytest.raises(RagsieveError, match="unknown ranking measure"):
        ranking_metrics(QRELS, RUN, measures=("ndcg",))
    with pytest.raises(RagsieveError, match="positive integers"):
        ranking_metrics(QRELS, RUN, ks=(0,))
    with pytest.raises(DataError, match="empty"):
        ranking_metrics({}, RUN)
    with pytest.raises(DataError, match="not a number"):
        ranking_metrics(QRELS, {"q1": {"d1": float("nan")}})


def test_run_from_rankings_keeps_first_duplicate():
    assert run_from_rankings({"q": [("a", 2), ("b", 1.5), ("a", 0.1)], "r": []}) == {
        "q": {"a": 2.0, "b": 1.5},
        "r": {},
    }


# ------------------------------------------------------------------- classification


def test_classification_metrics_hand_values():
    y_true = [1, 1, 1, 0, 0, 0, 1, 0]
    y_pred = [1, 0, 1, 0, 1, 0, 1, 0]  # tp = 3 (0, 2, 6), fn = 1 (1), fp = 1 (4), tn = 3
    y_score = [0.9, 0.3, 0.8, 0.2, 0.7, 0.1, 0.6, 0.4]
    # AUROC = P(pos > neg): pos .9 beats 4 negs, .3 beats 2, .8 beats 4, .6 beats 3 -> 13/16
    m = classification_metrics(y_true, y_pred, y_score)
    assert m == {
        "accuracy": 0.75,
        "precision": 0.75,
        "recall": 0.75,
        "f1": 0.75,
        "auroc": 0.8125,
        "confusion_matrix": [[3, 1], [1, 3]],
        "n": 8,
        "positive_rate": 0.5,
        "base_rate": 0.5,
    }


def test_classification_metrics_degenerate():
    m = classification_metrics([1, 1, 1], [0, 0, 1], [0.2, 0.3, 0.9])
    assert m["auroc"] is None  # single class in y_true
    assert m["confusion_matrix"] == [[0, 0], [2, 1]]
    assert m["recall"] == pytest.approx(1 / 3)
    none_kept = classification_metrics([1, 0], [0, 0])
    assert none_kept["precision"] == 0.0 and none_kept["f1"] == 0.0  # zero_division=0
    assert none_kept["auroc"] is None  # no scores
    with pytest.raises(DataError, match="0/1"):
        classification_metrics([1, 2], [1, 0])
    with pytest.raises(DataError):
        classification_metrics([1, 0], [1])


def test_best_threshold():
    y = [0, 0, 1, 1, 0, 1]
    s = [0.1, 0.2, 0.3, 0.6, 0.7, 0.9]
    # Sorted: .9(1) .7(0) .6(1) .3(1) .2(0) .1(0); F1 for keeping down to each score:
    # .9: 2/4, .7: 2/5, .6: 4/6, .3: 6/7 (best), .2: 6/8, .1: 6/9 -> midpoint (.3 + .2) / 2
    assert best_threshold(y, s) == pytest.approx(0.25)
    # Accuracy peaks at the same cut (5/6).
    assert best_threshold(y, s, metric="accuracy") == pytest.approx(0.25)
    # Accuracy ties between keeping .9 (2/3) and keeping all (2/3): lowest threshold wins.
    assert best_threshold([1, 0, 1], [0.9, 0.5, 0.1], metric="accuracy") == 0.1
    # Keeping nothing is best (2/3): threshold just above the maximum.
    t = best_threshold([1, 0, 0], [0.1, 0.8, 0.9], metric="accuracy")
    assert 0.9 < t < 0.9 + 1e-9
    with pytest.raises(DataError, match="single class"):
        best_threshold([1, 1], [0.2, 0.3])
    with pytest.raises(RagsieveError, match="unknown threshold metric"):
        best_threshold(y, s, metric="auc")


# ------------------------------------------------------------------------------- QA


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Cat!", "cat"),
        ("An apple, a day", "apple day"),
        ("  HELLO \t  World  ", "hello world"),
        ("theory of anything", "theory of anything"),  # articles only as whole words
        ("U.S.A.", "usa"),
        ("the", ""),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_and_f1():
    assert exact_match("the Beatles.", ["beatles"])
    assert exact_match("Fab Four", ["Beatles", "the fab four"])  # second gold
    assert not exact_match("Beatles band", ["Beatles"])
    assert not exact_match("x", [])
    assert exact_match("Paris", "paris")  # a bare string is one gold
    # pred [big, red, dog] vs [red, dog]: P = 2/3, R = 1 -> F1 = 0.8; vs [cat]: 0
    assert token_f1("the big red dog", ["red dog", "a cat"]) == pytest.approx(0.8)
    assert token_f1("dog dog", ["dog"]) == pytest.approx(2 / 3)  # P = 1/2, R = 1
    assert token_f1("the", ["a"]) == 1.0  # both normalise to empty
    assert token_f1("cat", ["the"]) == 0.0
    assert token_f1("cat", []) == 0.0


def test_contains_answer():
    assert not contains_answer("It was none of them", ["one"])
    assert contains_answer("Number one!", ["One"])
    assert not contains_answer("a one-way street", ["one"])  # "oneway" is one token
    assert contains_answer("I love New York City.", ["Boston", "new york"])
    assert not contains_answer("York, New", ["new york"])
    assert not contains_answer("anything", [])
    assert not contains_answer("the answer", ["the"])  # gold normalises to nothing
    assert contains_answer("Einstein", "einstein")


def test_qa_metrics():
    preds = ["Paris", "It is London.", "none"]
    golds = [["paris"], ["London", "UK"], ["one"]]
    # containment 1, 1, 0; EM 1, 0, 0; F1 1, 1/2 (P 1/3, R 1), 0
    assert qa_metrics(preds, golds) == pytest.approx(
        {"accuracy": 2 / 3, "em": 1 / 3, "f1": 0.5, "n": 3}
    )
    with pytest.raises(DataError):
        qa_metrics(["a"], [["a"], ["b"]])
    with pytest.raises(DataError):
        qa_metrics([], [])


# ---------------------------------------------------------------------- calibration


def test_reliability_bins_and_ece():
    y = [0, 0, 1, 1, 1, 0]
    p = [0.1, 0.2, 0.3, 0.8, 1.0, 0.75]
    bins = reliability_bins(y, p, n_bins=4)
    # [0, .25): .1, .2 -> conf .15, acc 0 | [.25, .5): .3 -> acc 1 | [.5, .75): empty
    # [.75, 1]: .8, 1.0, .75 (left edge and 1.0 included) -> conf 2.55 / 3 = .85, acc 2/3
    assert [(b.lower, b.upper, b.count) for b in bins] == [
        (0.0, 0.25, 2), (0.25, 0.5, 1), (0.5, 0.75, 0), (0.75, 1.0, 3)
    ]
    assert bins[0].mean_confidence == pytest.approx(0.15) and bins[0].accuracy == 0.0
    assert bins[1].mean_confidence == pytest.approx(0.3) and bins[1].accuracy == 1.0
    assert bins[2].mean_confidence is None and bins[2].accuracy is None
    assert bins[3].mean_confidence == pytest.approx(0.85)
    assert bins[3].accuracy == pytest.approx(2 / 3)
    # ECE = 2/6 * .15 + 1/6 * .7 + 3/6 * |2/3 - .85| = .05 + .11667 + .09167 = .25833
    assert expected_calibration_error(y, p, n_bins=4) == pytest.approx(0.05 + 0.7 / 6 + 0.55 / 6)
    assert expected_calibration_error([0, 1], [0.0, 1.0]) == 0.0
    with pytest.raises(DataError, match="probabilities"):
        reliability_bins([0, 1], [0.5, 1.5])
    with pytest.raises(RagsieveError, match="n_bins"):
        reliability_bins([0, 1], [0.5, 0.5], n_bins=0)


# ----------------------------------------------------------------------------- plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plots_write_png(tmp_path):
    cm_path = plot_confusion_matrix([[50, 3], [7, 40]], tmp_path / "sub" / "cm.png", "cm")
    rel_path = plot_reliability_diagram(
        [0, 0, 1, 1, 1, 0], [0.1, 0.2, 0.3, 0.8, 1.0, 0.75], tmp_path / "rel.png", "rel", n_bins=4
    )
    for path in (cm_path, rel_path):
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
    with pytest.raises(DataError):
        plot_confusion_matrix([[1, 2, 3]], tmp_path / "bad.png")


def test_docstring_examples():
    for module in (ranking, classification, qa, calibration):
        result = doctest.testmod(module)
        assert result.failed == 0, module.__name__


def test_accuracy_interval_is_wilson_and_rejects_bad_counts():
    from ragsieve.eval import accuracy_interval

    lo, hi = accuracy_interval(20, 24)
    # Wilson by hand: centre (p + z²/2n) / (1 + z²/n), half-width z·sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n)
    z, n, p = 1.959963984540054, 24, 20 / 24
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert lo == pytest.approx(centre - half) and hi == pytest.approx(centre + half)
    assert accuracy_interval(0, 5)[0] == 0.0 and accuracy_interval(5, 5)[1] == pytest.approx(1.0)
    with pytest.raises(DataError, match="at least one"):
        accuracy_interval(0, 0)
    with pytest.raises(DataError, match="correct must lie"):
        accuracy_interval(6, 5)


def test_stats_doctests_and_paired_tests():
    import doctest

    from ragsieve.eval import stats
    from ragsieve.eval.stats import mcnemar_exact, paired_bootstrap

    assert doctest.testmod(stats).failed == 0
    a = np.r_[np.ones(60), np.zeros(40)]
    clear = paired_bootstrap(a, np.r_[np.ones(40), np.zeros(60)])
    assert clear.diff == pytest.approx(0.2) and clear.low > 0 and clear.p_value < 0.05 and clear.verdict == "A better"
    noise = paired_bootstrap(a, np.r_[np.ones(58), np.zeros(42)])
    assert noise.verdict == "no measurable difference"
    same = mcnemar_exact(a, a)
    assert (same.a_only, same.b_only, same.p_value) == (0, 0, 1.0)
    with pytest.raises(RagsieveError, match="equal-length"):
        mcnemar_exact([1, 0], [1])


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.UndefinedMetricWarning")
def test_bootstrap_metric_skips_resamples_where_auroc_is_undefined():
    """scikit-learn returns nan (not an error) for one class; such resamples must not poison the interval."""
    from sklearn.metrics import roc_auc_score

    from ragsieve.eval.stats import bootstrap_metric

    y, s = np.array([1, 0, 0, 0, 0, 0]), np.array([0.9, 0.1, 0.2, 0.3, 0.4, 0.5])  # 1/3 of resamples lack a 1
    est, low, high = bootstrap_metric(roc_auc_score, y, s, n_boot=200)
    assert est == 1.0 and math.isfinite(low) and math.isfinite(high)


def test_rank_auroc_equals_sklearn_with_ties_and_refuses_one_class():
    """The bootstrap loops' AUROC is scikit-learn's value (ties half), only faster."""
    from sklearn.metrics import roc_auc_score

    from ragsieve.eval.stats import rank_auroc

    rng = np.random.default_rng(0)
    for n, decimals in ((6, 0), (40, 1), (300, 3), (300, 8)):
        labels = np.r_[0, 1, rng.integers(0, 2, n - 2)]
        scores = np.round(rng.normal(size=n) + labels, decimals)  # rounding makes ties
        assert rank_auroc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    with pytest.raises(ValueError, match="both classes"):
        rank_auroc(np.array([1, 1]), np.array([0.2, 0.3]))


def test_cluster_bootstrap_resamples_whole_queries_and_widens_the_interval():
    """5 examples per query that agree within the query: by example the interval is too narrow."""
    from ragsieve.eval.stats import bootstrap_ci, bootstrap_metric, bootstrap_rows, paired_bootstrap

    rng = np.random.default_rng(3)
    per_query = rng.integers(0, 2, 40)
    values, groups = np.repeat(per_query, 5).astype(float), np.repeat(np.arange(40), 5)
    _, lo_ex, hi_ex = bootstrap_ci(values)
    est, lo_q, hi_q = bootstrap_ci(values, groups=groups)
    assert est == pytest.approx(values.mean()) and hi_q - lo_q > 1.8 * (hi_ex - lo_ex)
    # every resample holds whole queries: 5 rows of each query drawn, in one block
    for rows in bootstrap_rows(len(values), groups, 20, np.random.default_rng(0)):
        assert len(rows) == 200 and all(np.bincount(groups[rows], minlength=40) % 5 == 0)
    # the fast path of the mean equals the general one on the same draws
    slow = bootstrap_ci(values, statistic=lambda v: float(np.mean(v)), groups=groups)
    assert slow == pytest.approx((est, lo_q, hi_q))
    assert bootstrap_metric(lambda v: float(np.mean(v)), values, groups=groups, n_boot=2000) == pytest.approx(
        (est, lo_q, hi_q))
    other = np.repeat(rng.integers(0, 2, 40), 5).astype(float)
    fast, general = paired_bootstrap(values, other, groups=groups), paired_bootstrap(
        values, other, statistic=lambda v: float(np.mean(v)), groups=groups)
    assert (fast.low, fast.high, fast.p_value) == pytest.approx((general.low, general.high, general.p_value))
    with pytest.raises(DataError, match="one query id per example"):
        bootstrap_ci(values, groups=groups[:-1])


def test_conservative_query_interval_is_wilson_for_single_queries_and_widens_with_query_size():
    """Outcomes not stored, queries known: Wilson at the worst-case effective n (n / Σm²/n)."""
    from ragsieve.eval import accuracy_interval
    from ragsieve.eval.stats import conservative_query_interval, worst_case_design_effect

    assert conservative_query_interval(137, [1] * 160)[1:] == pytest.approx(accuracy_interval(137, 160), abs=1e-12)
    assert worst_case_design_effect([2] * 8 + [1] * 144) == pytest.approx(176 / 160)
    widths = []
    for size in (1, 2, 4, 8, 16):  # 160 examples in queries of one size
        acc, low, high = conservative_query_interval(137, [size] * (160 // size))
        assert acc == 137 / 160 and 0 <= low < acc < high <= 1
        widths.append(high - low)
    assert widths == sorted(widths) and len(set(widths)) == len(widths)
    # one shared query among 160 already widens it; a single query of all examples is Wilson at n = 1
    assert conservative_query_interval(137, [2] + [1] * 158)[1] < accuracy_interval(137, 160)[0]
    assert conservative_query_interval(4, [4])[1:] == pytest.approx(accuracy_interval(1, 1), abs=1e-12)
    with pytest.raises(DataError):
        conservative_query_interval(5, [2, 2])

def test_target_verdicts_follow_the_interval():
    from ragsieve.eval.stats import MET, MET_AT_POINT, MISSED, family_verdict, proportion_interval, target_verdict

    assert target_verdict(0.667, 0.612, 0.718, 0.60) == MET
    assert target_verdict(0.643, 0.590, 0.693, 0.60) == MET_AT_POINT  # straddles
    assert target_verdict(0.48, 0.42, 0.54, 0.60) == MISSED
    assert target_verdict(0.58, 0.55, 0.65, 0.60) == MISSED  # the point estimate misses
    assert target_verdict(-0.014, -0.048, 0.018, -0.01) == MISSED  # forgetting: at least -0.01
    assert target_verdict(0.20, 0.15, 0.25, 0.30, higher_is_better=False) == MET  # e.g. an error rate ≤ 0.30
    assert family_verdict([MET, MET_AT_POINT, MET_AT_POINT, MET_AT_POINT, MISSED, MISSED], needed=4) == MET_AT_POINT
    assert family_verdict([MET] * 4 + [MISSED] * 2, needed=4) == MET
    assert family_verdict([MET_AT_POINT, MISSED]) == MISSED
    # independent examples: Wilson; repeated queries: the bootstrap over queries (wider)
    correct = [1] * 60 + [0] * 40
    wilson, by_query = proportion_interval(correct), proportion_interval(correct, groups=np.arange(100) // 10)
    assert wilson[0] == by_query[0] == 0.6 and by_query[2] - by_query[1] > wilson[2] - wilson[1]
