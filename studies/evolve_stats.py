"""Statistics of the evolving-reranker study on its fixed test set (issue #16).

Every cell stores, per round t = 0..R (t = 0 is M0, shared), M_t's right/wrong on the same
test examples (``test.correct``, a 0/1 string aligned with the cell's ``test_ids``). That
makes every comparison paired:

Some test sets hold several examples per query (HotpotQA: 300 sentences of 61 questions; BioASQ,
MultiRC), and a query's examples are not independent. Every interval and test here therefore
resamples whole queries (``test_query_ids``) where queries repeat (:func:`ragsieve.eval.stats.proportion_interval`,
``paired_bootstrap(groups=...)``), and keeps the Wilson interval / exact tests where each example is its own query:

* :func:`test_curve` — accuracy of M_t on the test set by round, with its 95 % interval;
* :func:`m0_vs_chance` — M0's accuracy, its interval and the p-value against 50 %, the +10 pp target's
  verdict, and its threshold-free AUROC (:func:`m0_auroc`, bootstrapped over whole queries);
* :func:`paired_last_round` — two cells' M_R on the same test examples: exact McNemar, or the paired
  bootstrap over queries where queries repeat (and :func:`paired_auroc`, the paired bootstrap of
  their AUROC difference);
* :func:`paired_m0` — the same for two runs' M0s (per-dataset vs mixed);
* :func:`scale_targets` — the issue's three targets, each with its p-values and verdict.

Example::

    >>> cell = {"test_ids": ["a", "b", "c", "d"], "rounds": [{"round": 1, "test": {"correct": "1101"}}]}
    >>> m0 = {"test": {"correct": "0101"}}
    >>> [(r["round"], r["accuracy"]) for r in test_curve(cell, m0)]
    [(0, 0.5), (1, 0.75)]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

CHANCE = 0.5  # the test sets are balanced
M0_MARGIN = 0.10  # target: M0 >= chance + 10 pp


def correct_vector(entry: Mapping[str, Any]) -> list[int]:
    """The 0/1 string of a stored evaluation as ints."""
    return [int(c) for c in entry["correct"]]


def clustered(query_ids: list[str] | None) -> bool:
    """Whether some query holds several test examples (then intervals and tests resample queries)."""
    return bool(query_ids) and len(set(query_ids)) < len(query_ids)


def score_summary(correct: list[int], predictions: list[int] | None = None,
                  query_ids: list[str] | None = None) -> dict[str, Any]:
    """n, accuracy, 95 % interval (and the share predicted "true") of right/wrong outcomes: Wilson, or the
    bootstrap over whole queries when ``query_ids`` repeat (then ``queries`` says how many)."""
    from ragsieve.eval.stats import proportion_interval

    n, k = len(correct), sum(correct)
    out: dict[str, Any] = {"n": n, "accuracy": round(k / n, 4) if n else None, "ci95": None}
    if n:
        _, low, high = proportion_interval(correct, query_ids if clustered(query_ids) else None)
        out["ci95"] = [round(low, 4), round(high, 4)]
    if clustered(query_ids):
        out["queries"] = len(set(query_ids))
    if predictions is not None and n:
        out["positive_rate"] = round(sum(predictions) / n, 4)
    return out


def labels_of(entry: Mapping[str, Any]) -> list[int]:
    """The gold labels behind a stored evaluation: the prediction where it was right, the other where wrong."""
    return [int(p) if c == "1" else 1 - int(p) for p, c in zip(entry["pred"], entry["correct"])]


def threshold_free(labels: list[int], margins: list[float]) -> dict[str, Any]:
    """AUROC of the verdict margins (None with one class only): does the model separate the labels at all?

    >>> threshold_free([0, 1, 1, 0], [-1.0, 2.0, 0.5, 0.7])
    {'auroc': 0.75}
    """
    import numpy as np

    from ragsieve.eval.stats import auroc_interval

    auroc = auroc_interval(np.array(labels), np.array(margins), np.arange(len(labels)), n_boot=0)["auroc"]
    return {"auroc": round(auroc, 4) if auroc is not None else None}


def m0_auroc(m0: Mapping[str, Any], n_boot: int = 1000, seed: int = 0) -> dict[str, Any] | None:
    """M0's test AUROC with a 95 % bootstrap interval over whole queries (None for records without margins)."""
    import numpy as np

    from ragsieve.eval.stats import auroc_interval

    entry = m0["test"]
    if "margins" not in entry:
        return None
    groups = m0.get("test_query_ids") or m0["test_ids"]
    r = auroc_interval(np.array(labels_of(entry)), np.array(entry["margins"]), np.array(groups), n_boot, seed)
    ci = [round(r["low"], 4), round(r["high"], 4)] if r["low"] is not None else None
    return {"auroc": round(r["auroc"], 4) if r["auroc"] is not None else None, "ci95": ci, "queries": len(set(groups))}


def round_tests(cell: Mapping[str, Any], m0: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any]]]:
    """(t, M_t's test evaluation) for t = 0 (M0) .. R. A round that trained nothing has the model of the round
    before, so its evaluation is that one (SFT-only: M0's, including margins recorded after the cell finished).

    >>> m0 = {"test": {"correct": "01", "margins": [0.1, 0.2]}}
    >>> cell = {"rounds": [{"round": 1, "trained": False, "test": {"correct": "01"}}]}
    >>> [(t, "margins" in e) for t, e in round_tests(cell, m0)]
    [(0, True), (1, True)]
    """
    rows, previous = [(0, m0["test"])], m0["test"]
    for r in cell["rounds"]:
        if "test" in r:
            previous = previous if r.get("trained") is False else r["test"]
            rows.append((int(r["round"]), previous))
    return rows


def test_curve(cell: Mapping[str, Any], m0: Mapping[str, Any]) -> list[dict[str, Any]]:
    """M_t's test accuracy for t = 0 (M0) .. R, each with its interval (by query where queries repeat)."""
    out = []
    for t, entry in round_tests(cell, m0):
        c = correct_vector(entry)
        preds = [int(p) for p in entry["pred"]] if "pred" in entry else None
        out.append({"round": int(t), **score_summary(c, preds, m0.get("test_query_ids")), "auroc": entry.get("auroc")})
    return out


def m0_vs_chance(m0: Mapping[str, Any]) -> dict[str, Any]:
    """M0 against a coin (balanced test): accuracy, interval, one-sided p (exact binomial, or the bootstrap
    over queries where queries repeat) and the +10 pp target's verdict (met only when the interval clears it)."""
    from scipy.stats import binomtest

    from ragsieve.eval.stats import paired_bootstrap, target_verdict

    c = correct_vector(m0["test"])
    queries = m0.get("test_query_ids")
    n, k = len(c), sum(c)
    acc = k / n
    if clustered(queries):
        vs_coin = paired_bootstrap(c, [CHANCE] * n, groups=queries)  # two-sided; halved on the observed side
        p = vs_coin.p_value / 2 if vs_coin.diff > 0 else 1 - vs_coin.p_value / 2
        test = "bootstrap over queries (one-sided)"
    else:
        p = float(binomtest(k, n, CHANCE, alternative="greater").pvalue)
        test = "exact binomial (one-sided)"
    summary = score_summary(c, query_ids=queries)
    return {
        **summary, "above_chance_pp": round(100 * (acc - CHANCE), 1), "p_value_vs_chance": p, "test": test,
        "target_met": acc >= CHANCE + M0_MARGIN,
        # the stricter reading: the whole interval clears chance + 10 pp
        "target_met_with_ci": summary["ci95"][0] >= CHANCE + M0_MARGIN,
        "verdict": target_verdict(acc, *summary["ci95"], CHANCE + M0_MARGIN),
        # threshold-free: a reranker ranks by the margin, so this is what M0 has learned to rank
        "auroc": m0_auroc(m0),
    }


def paired_outcomes(va: list[int], vb: list[int], query_ids: list[str] | None) -> dict[str, Any]:
    """A's and B's right/wrong on the same examples: the difference with its 95 % interval, who alone was
    right, and the paired test: exact McNemar where each example is its own query, else the paired
    bootstrap over whole queries (McNemar takes the examples as independent)."""
    from ragsieve.eval.stats import mcnemar_exact, paired_bootstrap, verdict

    groups = query_ids if clustered(query_ids) else None
    exact = mcnemar_exact(va, vb)
    boot = paired_bootstrap(va, vb, groups=groups)
    p = boot.p_value if groups is not None else exact.p_value
    out = {"n": exact.n, "diff": round(exact.diff, 4), "diff_ci95": [round(boot.low, 4), round(boot.high, 4)],
           "a_only": exact.a_only, "b_only": exact.b_only, "p_value": p,
           "test": "paired bootstrap over queries" if groups is not None else "exact McNemar",
           "verdict": verdict(p, exact.diff)}
    if groups is not None:
        out.update(queries=len(set(query_ids)), p_mcnemar=exact.p_value)
    return out


def paired_last_round(a: Mapping[str, Any], b: Mapping[str, Any], m0: Mapping[str, Any]) -> dict[str, Any] | None:
    """A's and B's last-round models on the same test examples (:func:`paired_outcomes`)."""
    if a.get("test_ids") != b.get("test_ids") or not a.get("test_ids"):
        return None  # not the same examples: no paired test
    (last, ta), (_, tb) = round_tests(a, m0)[-1], round_tests(b, m0)[-1]
    va, vb = correct_vector(ta), correct_vector(tb)
    queries = m0.get("test_query_ids")
    ca, cb = score_summary(va, query_ids=queries), score_summary(vb, query_ids=queries)
    test = paired_outcomes(va, vb, queries)
    out = {"round": last, "n": test.pop("n"), "a": ca["accuracy"], "b": cb["accuracy"], "a_ci95": ca["ci95"],
           "b_ci95": cb["ci95"], **test}
    auroc = paired_auroc(ta, tb, m0.get("test_query_ids") or a["test_ids"])
    if auroc:
        out["auroc"] = auroc
    return out


def add_holm(tests: dict[str, dict | None]) -> None:
    """Holm-adjust a dataset's paired accuracy tests in place (``p_holm``, ``verdict_holm``), with
    :func:`ragsieve.eval.stats.holm`.

    The issue's two comparisons are stated in advance; the rest are read together, so a single
    p < 0.05 among several tests on one test set is not taken as a win on its own.
    """
    from ragsieve.eval.stats import holm, verdict

    done = {name: r for name, r in tests.items() if r}
    for (name, r), p in zip(done.items(), holm([r["p_value"] for r in done.values()])):
        r.update(p_holm=p, holm_family=len(done), verdict_holm=verdict(p, r["diff"]))


def paired_auroc(a: Mapping[str, Any], b: Mapping[str, Any], groups: list[str], n_boot: int = 1000) -> dict | None:
    """AUROC(A) − AUROC(B) of two evaluations of the same examples, paired bootstrap over whole queries
    (None unless both kept their margins)."""
    import numpy as np

    from ragsieve.eval.stats import auroc_difference, verdict

    if "margins" not in a or "margins" not in b:
        return None
    d = auroc_difference(np.array(labels_of(a)), np.array(a["margins"]), np.array(b["margins"]), np.array(groups),
                         n_boot=n_boot)
    out = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}
    if d["p_value"] is not None:
        out["verdict"] = verdict(d["p_value"], d["diff"], d["low"], d["high"])
    return out


def _test_rows(m0: Mapping[str, Any], ids: list[str]) -> dict[str, Any]:
    """The test record restricted to ``ids`` (in that order): outcomes, verdicts, margins, query ids."""
    at = {x: i for i, x in enumerate(m0["test_ids"])}
    rows = [at[x] for x in ids]
    test = m0["test"]
    out: dict[str, Any] = {k: "".join(test[k][i] for i in rows) for k in ("correct", "pred") if k in test}
    if "margins" in test:
        out["margins"] = [test["margins"][i] for i in rows]
    queries = m0.get("test_query_ids") or m0["test_ids"]
    out["query_ids"] = [queries[i] for i in rows]
    return out


def paired_m0(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any] | None:
    """Exact McNemar of two runs' M0s (e.g. per-dataset vs mixed) on the test examples both scored.

    Two runs whose test sets differ in part (e.g. one held downstream questions out and the other
    did not) are compared on the shared examples (``n``; ``a_only_examples`` / ``b_only_examples``
    say how many were left out); with none shared there is no paired test (None).

    >>> paired_m0({"m0": "mixed", "test_ids": ["a", "b"], "test": {"correct": "11"}},
    ...           {"m0": "per-dataset", "test_ids": ["a", "b"], "test": {"correct": "01"}})["a_only"]
    1
    """
    in_b = set(b.get("test_ids") or [])
    shared = [x for x in a.get("test_ids") or [] if x in in_b]
    if not shared:
        return None  # not the same examples: no paired test
    ta, tb = _test_rows(a, shared), _test_rows(b, shared)
    ca, cb = correct_vector(ta), correct_vector(tb)
    queries = ta["query_ids"]
    out = {"a": a.get("m0"), "b": b.get("m0"), "a_test": score_summary(ca, query_ids=queries),
           "b_test": score_summary(cb, query_ids=queries), **paired_outcomes(ca, cb, queries)}
    if len(shared) < max(len(a["test_ids"]), len(in_b)):
        out.update(a_only_examples=len(a["test_ids"]) - len(shared), b_only_examples=len(in_b) - len(shared))
    auroc = paired_auroc(ta, tb, ta["query_ids"])  # the ranking view
    if auroc:
        out["auroc"] = auroc
    return out


def scale_targets(m0_stats: Mapping[str, Any], paired: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's targets with their p-values.

    * M0 >= chance + 10 pp on at least 4 of 6 datasets (two thirds of those run);
    * ReplayDPO >= DPO on the last round on every dataset run;
    * CautiousDPO > SFT-only on >= 4 of 6 (or >= 2 of 3): two thirds of those run.

    ``met`` follows the point estimates as the issue words them; ``verdict`` is the one vocabulary of
    :func:`ragsieve.eval.stats.target_verdict`: "met" only when the 95 % intervals clear the target
    on enough datasets, "met at the point estimate, not shown" when they straddle it, else "missed".
    ``significant`` says which differences also pass the paired test (p < 0.05).
    """
    from ragsieve.eval.stats import family_verdict, target_verdict

    def two_thirds(n: int) -> int:
        return math.ceil(2 * n / 3)

    def diff_verdict(r: Mapping[str, Any], strict: bool) -> str:
        low, high = r.get("diff_ci95") or (None, None)
        v = target_verdict(r["diff"], low, high, 0.0)
        # "better than" (strict): a difference of exactly 0 misses, and an interval touching 0 does not show it
        if strict and (r["diff"] <= 0 or (v == "met" and low <= 0)):
            return "missed" if r["diff"] <= 0 else "met at the point estimate, not shown"
        return v

    m0_hits = {ds: s["target_met"] for ds, s in m0_stats.items()}
    m0_verdicts = {ds: s.get("verdict") or target_verdict(s["accuracy"], *s["ci95"], CHANCE + M0_MARGIN)
                   for ds, s in m0_stats.items()}
    replay = {ds: p["replay-dpo vs dpo"] for ds, p in paired.items() if p.get("replay-dpo vs dpo")}
    cautious = {ds: p["cautious-dpo vs sft-only"] for ds, p in paired.items() if p.get("cautious-dpo vs sft-only")}
    wins = {ds: r["diff"] > 0 for ds, r in cautious.items()}
    replay_verdicts = {ds: diff_verdict(r, strict=False) for ds, r in replay.items()}
    cautious_verdicts = {ds: diff_verdict(r, strict=True) for ds, r in cautious.items()}
    return {
        "m0_above_chance_plus_10pp": {
            "per_dataset": {ds: {**{k: s[k] for k in ("accuracy", "ci95", "p_value_vs_chance", "target_met")},
                                 "verdict": m0_verdicts[ds]} for ds, s in m0_stats.items()},
            "hits": sum(m0_hits.values()), "needed": two_thirds(len(m0_hits)),
            "met": bool(m0_hits) and sum(m0_hits.values()) >= two_thirds(len(m0_hits)),
            "shown": sum(v == "met" for v in m0_verdicts.values()),
            "verdict": family_verdict(list(m0_verdicts.values()), two_thirds(len(m0_hits))),
        },
        "replay_ge_dpo_last_round": {
            "per_dataset": {ds: {**_brief(r), "met": r["diff"] >= 0, "verdict": replay_verdicts[ds]}
                            for ds, r in replay.items()},
            "met": bool(replay) and all(r["diff"] >= 0 for r in replay.values()),
            "verdict": family_verdict(list(replay_verdicts.values())),
        },
        "cautious_gt_sft_only": {
            "per_dataset": {ds: {**_brief(r), "met": wins[ds], "verdict": cautious_verdicts[ds]}
                            for ds, r in cautious.items()},
            "wins": sum(wins.values()), "needed": two_thirds(len(wins)),
            "significant_wins": sum(1 for r in cautious.values() if r["diff"] > 0 and r["p_value"] < 0.05),
            "met": bool(wins) and sum(wins.values()) >= two_thirds(len(wins)),
            "verdict": family_verdict(list(cautious_verdicts.values()), two_thirds(len(wins))),
        },
    }


def _brief(r: Mapping[str, Any]) -> dict[str, Any]:
    return {k: r.get(k) for k in ("a", "b", "diff", "diff_ci95", "a_only", "b_only", "p_value", "test", "verdict")}


def forgetting_summary(outcomes: list[list[int]], query_ids: list[list[str]], upto: int) -> dict[str, Any]:
    """M_t's right/wrong on the forgetting samples of splits 0..``upto`` (0 = the SFT set, s = D_s):
    per split, all splits seen, and the splits before the last (what M_t was trained on before this round).

    Each split keeps its outcomes (``correct``, aligned with the record's ``forgetting_ids``), and every
    interval resamples whole queries where a query holds several sampled examples (:func:`score_summary`).

    >>> r = forgetting_summary([[1, 0], [1, 1]], [["q1", "q1"], ["q2", "q3"]], 1)
    >>> r["seen"]["n"], r["seen"]["queries"], r["splits"]["0"]["correct"], r["earlier"]["accuracy"]
    (4, 3, '10', 0.5)
    """
    def summary(splits: range) -> dict[str, Any]:
        return score_summary([c for s in splits for c in outcomes[s]],
                             query_ids=[q for s in splits for q in query_ids[s]])

    splits = {str(s): {**score_summary(outcomes[s], query_ids=query_ids[s]), "correct": "".join(map(str, outcomes[s]))}
              for s in range(upto + 1)}
    return {"seen": summary(range(upto + 1)), "earlier": summary(range(upto)), "splits": splits, "interval_by": "query"}


# A forgetting record kept only its summaries: its intervals are widened to query level, conservatively.
CONSERVATIVE_BY_QUERY = "query (conservative: worst-case design effect)"


def conservative_forgetting(entry: Mapping[str, Any], query_ids: list[list[str]]) -> dict[str, Any] | None:
    """An older forgetting row (``seen``, ``earlier``, ``splits``: n, accuracy and a Wilson interval by
    example, no outcome per example) with every interval by query, given the samples' query ids per split
    (rebuilt from the seed: :func:`~studies.evolve.forgetting_samples`): whole queries cannot be
    resampled, so each interval is Wilson at the worst-case effective n
    (:func:`ragsieve.eval.stats.conservative_query_interval`). None when the ids do not fit the row's sizes.

    >>> entry = {"seen": {"n": 4, "accuracy": 0.75, "ci95": [0.3, 0.95]}, "earlier": {"n": 2, "accuracy": 0.5,
    ...          "ci95": [0.1, 0.9]}, "splits": {"0": {"n": 2, "accuracy": 0.5, "ci95": [0.1, 0.9]},
    ...                                      "1": {"n": 2, "accuracy": 1.0, "ci95": [0.3, 1.0]}}}
    >>> r = conservative_forgetting(entry, [["q1", "q1"], ["q2", "q3"]])
    >>> r["interval_by"], r["seen"]["queries"], r["seen"]["design_effect"], r["splits"]["1"]["ci95"][0]
    ('query (conservative: worst-case design effect)', 3, 1.5, 0.3424)
    """
    from collections import Counter

    from ragsieve.eval.stats import conservative_query_interval, worst_case_design_effect

    upto = max(int(s) for s in entry["splits"])
    if len(query_ids) <= upto or any(entry["splits"][str(s)]["n"] != len(query_ids[s]) for s in range(upto + 1)):
        return None

    def widened(part: Mapping[str, Any], splits: range) -> dict[str, Any]:
        if not part["n"]:
            return dict(part)
        sizes = list(Counter(q for s in splits for q in query_ids[s]).values())
        _, low, high = conservative_query_interval(round(part["accuracy"] * part["n"]), sizes)
        out = {**part, "ci95": [round(low, 4), round(high, 4)]}
        if len(sizes) < part["n"]:  # as score_summary: the query count where queries repeat
            out.update(queries=len(sizes), design_effect=round(worst_case_design_effect(sizes), 4))
        return out

    seen = widened(entry["seen"], range(upto + 1))
    return {"seen": seen, "earlier": widened(entry["earlier"], range(upto)),
            "splits": {str(s): widened(entry["splits"][str(s)], range(s, s + 1)) for s in range(upto + 1)},
            "interval_by": CONSERVATIVE_BY_QUERY if "queries" in seen else "query"}


def forgetting_curve(cell: Mapping[str, Any], m0: Mapping[str, Any],
                     sample_query_ids: list[list[str]] | None = None) -> list[dict[str, Any]]:
    """Accuracy of M_t on samples of the splits it has been trained on (0 = the SFT set).

    A record that kept each example's outcome and the samples' query ids is summarised afresh
    (:func:`forgetting_summary`: the bootstrap over whole queries). An older one kept only its summaries:
    given the samples' query ids (``sample_query_ids``, rebuilt from the seed), its intervals are widened to
    query level by the worst-case design effect (:func:`conservative_forgetting`); without them its Wilson
    intervals take the examples as independent, and its rows say so (``interval_by: example``).
    """
    def row(t: int, entry: Mapping[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
        splits, queries = entry.get("splits", {}), record.get("forgetting_query_ids")
        if queries and splits and all("correct" in s for s in splits.values()):
            upto = max(int(s) for s in splits)
            return {"round": t, **forgetting_summary([correct_vector(splits[str(s)]) for s in range(upto + 1)],
                                                     queries, upto)}
        if splits and sample_query_ids and (widened := conservative_forgetting(entry, sample_query_ids)):
            return {"round": t, **widened}
        return {"round": t, **entry, "interval_by": "example"}

    rows = [row(0, m0["forgetting"], m0)] if "forgetting" in m0 else []
    rows += [row(r["round"], r["forgetting"], cell) for r in cell["rounds"] if "forgetting" in r]
    return rows


def pseudo_label_rows(cell: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per round: accepted pseudo-labels, their accuracy vs gold, verdict mix, self vs jury."""
    out = []
    for r in cell["rounds"]:
        lab = r.get("labels", {})
        out.append({
            "round": r["round"], "n": lab.get("n"), "accepted": lab.get("accepted"), "accuracy": lab.get("accuracy"),
            "accepted_true": lab.get("accepted_true"), "gold_true": lab.get("gold_true"),
            "self": lab.get("self"), "jury": lab.get("jury"), "ties_skipped": lab.get("ties_skipped"),
            "dropped_for_balance": lab.get("dropped_for_balance"), "model_positive_rate": r.get("positive_rate"),
        })
    return out


# A balanced test set called >= 90 % one way: the verdict no longer depends on the input.
COLLAPSE_SHARE = 0.9


def collapse_summary(pseudo_labels: Mapping[str, Mapping[str, list]], test_curves: Mapping[str, Mapping[str, list]],
                     paired: Mapping[str, Mapping[str, Any]], cell: str = "cautious-dpo") -> dict[str, dict[str, Any]]:
    """Per dataset, how a CautiousDPO cell's self-training went: where its labels came from, how they
    leaned, and whether M_R's verdict collapsed to one label on the balanced test set.

    ``lean`` is the share labelled "true" minus the share that is "true" by gold among the accepted
    (> 0: the labels lean "true"). ``collapsed`` is M_R calling ≥ 90 % (or ≤ 10 %) of the test set "true".

    Example::

        >>> rows = [{"round": 1, "accepted": 10, "accuracy": 0.5, "accepted_true": 9, "gold_true": 5,
        ...          "self": {"n": 0}, "jury": {"n": 10, "accuracy": 0.5}}]
        >>> curve = [{"round": 0, "positive_rate": 0.6, "accuracy": 0.55}, {"round": 1, "positive_rate": 1.0, "accuracy": 0.5}]
        >>> s = collapse_summary({"d": {"cautious-dpo": rows}}, {"d": {"cautious-dpo": curve}}, {})["d"]
        >>> s["first_round"]["lean"], s["collapsed"], s["collapsed_to"]
        (0.4, True, 'true')
    """
    def round_view(r: Mapping[str, Any]) -> dict[str, Any]:
        accepted = r.get("accepted") or 0
        lean = (r["accepted_true"] - r["gold_true"]) / accepted if accepted and r.get("gold_true") is not None else None
        jury, own = r.get("jury") or {}, r.get("self") or {}
        return {"round": r["round"], "accepted": accepted, "label_accuracy": r.get("accuracy"),
                "lean": None if lean is None else round(lean, 3),
                "self_labelled": own.get("n", 0), "jury_labelled": jury.get("n", 0),
                "jury_accuracy": jury.get("accuracy"), "self_accuracy": own.get("accuracy")}

    out: dict[str, dict[str, Any]] = {}
    for ds, by_cell in pseudo_labels.items():
        rows, curve = by_cell.get(cell), test_curves.get(ds, {}).get(cell)
        if not rows or not curve:
            continue
        share = curve[-1].get("positive_rate")
        collapsed = share is not None and (share >= COLLAPSE_SHARE or share <= 1 - COLLAPSE_SHARE)
        vs = paired.get(ds, {}).get(f"{cell} vs sft-only", {})
        out[ds] = {
            "cell": cell, "first_round": round_view(rows[0]), "last_round": round_view(rows[-1]),
            "test_share_true": [c.get("positive_rate") for c in curve],  # M0, M_1 … M_R
            "test_auroc": [c.get("auroc") for c in curve],
            "collapsed": collapsed, "collapsed_to": ("true" if share >= 0.5 else "false") if collapsed else None,
            "vs_sft_only": {k: vs.get(k) for k in ("diff", "a_only", "b_only", "p_value", "test", "verdict")}
            if vs else None,
        }
    return out
