"""``TABLES.md`` of the evolving-reranker study at scale: ``metrics.json`` as markdown tables.

Written next to ``metrics.json`` after every finished cell, so the numbers a README quotes are
generated, never copied by hand, and a run spanning sessions can be read part-way. Pure
formatting: every figure is already in ``metrics.json`` (:mod:`studies.evolve_stats`).

Example::

    >>> m = {"cells": {"finished": 1, "planned": 2}, "m0_test": {}, "test_curves": {"fever": {"sft-only": [
    ...     {"round": 0, "n": 300, "accuracy": 0.6667, "ci95": [0.6115, 0.7176], "auroc": 0.72, "positive_rate": 0.75}]}}}
    >>> print(markdown_tables(m).splitlines()[0])
    # Evolving reranker at scale: tables generated from metrics.json (1 of 2 cells finished)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ragsieve.eval.tables import markdown_rows
from studies.evolve_stats import CONSERVATIVE_BY_QUERY


def _ci(ci, signed: bool = False) -> str:
    return f"[{_num(ci[0], signed=signed)}, {_num(ci[1], signed=signed)}]" if ci else ""


# metrics.json's name of a paired test → the table's
_TESTS = {"exact McNemar": "McNemar", "paired bootstrap over queries": "bootstrap by query"}


def _num(x, digits: int = 3, signed: bool = False) -> str:
    return "" if x is None else f"{x:{'+' if signed else ''}.{digits}f}"


def _source(d) -> str:
    """``{"n": 12, "accuracy": 0.75, ...}`` → ``12 (0.75)``."""
    if not d:
        return ""
    return f"{d['n']} ({d['accuracy']:.2f})" if d.get("accuracy") is not None else str(d["n"])


def _p(p, test: str | None = None) -> str:
    """A p-value as the table shows it; a bootstrap p of 0 is below its resolution (1 in 2,000 resamples)."""
    if p is None:
        return ""
    if test and "bootstrap" in test and p < 1e-3:
        return "< 0.001"
    return f"{p:.2g}" if p >= 1e-4 else "< 1e-4"


def _diff_p(ds: str, s: Mapping[str, Any]) -> str:
    """``bioasq -0.127 [-0.177, -0.077] (p < 0.001)``: a paired difference of the targets table."""
    return f"{ds} {s['diff']:+.3f} {_ci(s.get('diff_ci95'), signed=True)} (p {_p(s['p_value'], s.get('test'))})"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return [*markdown_rows(header, rows), ""]  # a blank line before what follows


def _curves(title: str, curves: Mapping[str, list[Mapping[str, Any]]]) -> list[str]:
    """One row per method (or variant): accuracy of M_t after each round, the last with its interval."""
    curves = {name: c for name, c in curves.items() if c}
    if not curves:
        return []
    rounds = max(len(c) for c in curves.values())
    header = ["", *[("M0" if t == 0 else f"M_{t}") for t in range(rounds)],
              "last: 95 % CI", "last: AUROC", "last: share called \"true\""]
    rows = []
    for name, curve in curves.items():
        last = curve[-1]
        rows.append([name, *[f"{r['accuracy']:.3f}" for r in curve], *[""] * (rounds - len(curve)),
                     _ci(last.get("ci95")), _num(last.get("auroc")), _num(last.get("positive_rate"), 2)])
    return [f"### {title}", "", *_table(header, rows)]


SWEEP_TITLES = {"alpha_sweep": "ReplayDPO: share α of new pairs", "tau_sweep": "CautiousDPO: gate τ",
                "ablation": "CautiousDPO variants"}


def _paired_table(by_dataset: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Paired last-round tests (``evolve_stats.paired_last_round`` records), one row each."""
    rows = []
    for ds, tests in by_dataset.items():
        for name, r in tests.items():
            if not r:
                continue
            auc = r.get("auroc") or {}
            rows.append([ds, name, r["n"], f"{r['a']:.3f} vs {r['b']:.3f}",
                         f"{r['diff']:+.3f} {_ci(r.get('diff_ci95'), signed=True)}".rstrip(),
                         f"{r['a_only']} vs {r['b_only']}", _TESTS.get(r.get("test"), "McNemar"),
                         _p(r["p_value"], r.get("test")),
                         r["verdict"],
                         _p(r["p_holm"], r.get("test")) if "p_holm" in r else "", r.get("verdict_holm", ""),
                         f"{auc['diff']:+.3f} [{auc['low']:+.3f}, {auc['high']:+.3f}], p {_p(auc['p_value'])}"
                         if auc else ""])
    return _table(["dataset", "A vs B", "n", "accuracy", "diff [95 % CI]", "only A / only B right", "test", "p",
                   "verdict", "p (Holm)", "verdict (Holm)", "AUROC diff [95 % CI]"], rows)


def _collapse_section(collapse: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One row per dataset from ``metrics.json → collapse`` (:func:`evolve_stats.collapse_summary`)."""
    if not collapse:
        return []
    lines = ["## CautiousDPO across datasets: does self-training collapse the verdict?", "",
             "Per dataset, the main CautiousDPO cell: round 1's accepted labels (who labelled them, how accurate, "
             "their lean = share labelled \"true\" − share \"true\" by gold), the last round's, and M_t's share "
             "called \"true\" on the balanced test set from M0 to M_R. Collapsed: M_R calls ≥ 90 % (or ≤ 10 %) "
             "of the test set one way.", ""]
    rows = []
    for ds, s in collapse.items():
        first, last, vs = s["first_round"], s["last_round"], s.get("vs_sft_only") or {}
        rows.append([ds, f"{first['self_labelled']} / {first['jury_labelled']}", _num(first["jury_accuracy"], 2),
                     _num(first["label_accuracy"], 2), _num(first["lean"], 2, signed=True),
                     f"{last['self_labelled']} / {last['jury_labelled']}", _num(last["label_accuracy"], 2),
                     _num(last["lean"], 2, signed=True),
                     " → ".join(_num(x, 2) for x in s["test_share_true"]),
                     " → ".join(_num(x, 3) for x in (s["test_auroc"][0], s["test_auroc"][-1])),
                     f"yes, to \"{s['collapsed_to']}\"" if s["collapsed"] else "no",
                     f"{vs['diff']:+.3f}, {vs['a_only']} vs {vs['b_only']}, p {_p(vs['p_value'], vs.get('test'))}"
                     if vs else ""])
    lines += _table(["dataset", "round 1: self / jury", "jury accuracy", "label accuracy", "lean",
                     "last round: self / jury", "label accuracy", "lean", "M_t share \"true\" (M0 → M_R)",
                     "AUROC (M0 → M_R)", "collapsed", "M_R vs SFT-only (diff, only A / only B, p)"], rows)
    return lines


def _forgetting_cell(row: Mapping[str, Any], part: str, sample: Mapping[str, Any]) -> str:
    """"accuracy [CI] (n, queries, the interval's unit)" of a forgetting row's ``seen`` or ``earlier``; an
    older record's query count is the forgetting sample's (``sizes``), when it is the same sample. A Wilson
    interval by example is by query where every example is its own query; a record kept without each
    outcome is widened to query level by the worst-case design effect ("by query, conservative").

    >>> row = {"earlier": {"n": 160, "accuracy": 0.85, "ci95": [0.8, 0.9]}}
    >>> _forgetting_cell(row, "earlier", {"n": 160, "queries": 157})
    '0.850 [0.800, 0.900] (n 160, 157 queries, by example)'
    >>> wide = {"earlier": {"n": 160, "accuracy": 0.85, "ci95": [0.78, 0.9], "queries": 152, "design_effect": 1.1}}
    >>> _forgetting_cell({**wide, "interval_by": "query (conservative: worst-case design effect)"}, "earlier", {})
    '0.850 [0.780, 0.900] (n 160, 152 queries, by query, conservative)'
    """
    entry = row[part]
    if entry["accuracy"] is None:
        return ""
    queries = entry.get("queries") or (sample.get("queries") if sample.get("n") == entry["n"] else None)
    by = row.get("interval_by")
    unit = ("by query, conservative" if by == CONSERVATIVE_BY_QUERY and "design_effect" in entry
            else "by query" if by in ("query", CONSERVATIVE_BY_QUERY) or queries == entry["n"] else "by example")
    unit = f"{queries} queries, {unit}" if queries else unit
    return f"{entry['accuracy']:.3f} {_ci(entry['ci95'])} (n {entry['n']}, {unit})"


def markdown_tables(metrics: Mapping[str, Any]) -> str:
    """The study's tables: test curves, paired tests, targets, sweeps, pseudo-labels, forgetting, QA."""
    lines = _intro(metrics.get("cells", {}))
    lines += _m0_section(metrics.get("m0_test", {}))
    lines += ["## Test accuracy after each round", ""]
    for ds, curves in metrics.get("test_curves", {}).items():
        lines += _curves(ds, curves)
    lines += _paired_section(metrics.get("paired", {}))
    lines += _targets_section(metrics.get("scale_targets"))
    lines += _sweep_sections(metrics)
    lines += _pseudo_label_section(metrics.get("pseudo_labels", {}))
    lines += _collapse_section(metrics.get("collapse", {}))
    lines += _forgetting_section(metrics.get("forgetting", {}), metrics.get("sizes", {}))
    lines += _downstream_section(metrics.get("downstream_stats") or {})
    return "\n".join(lines).rstrip() + "\n"


def _intro(cells: Mapping[str, Any]) -> list[str]:
    """The title (cells finished of planned) and how the intervals, paired tests and verdicts are made."""
    return [f"# Evolving reranker at scale: tables generated from metrics.json "
            f"({cells.get('finished', '?')} of {cells.get('planned', '?')} cells finished)", "",
            "Accuracy on each dataset's fixed test set (n per row in metrics.json → test_curves) with 95 % "
            "intervals: Wilson where every test example is its own query (FEVER, ANLI, PubMedQA), else a "
            "bootstrap over whole queries (BioASQ 150, HotpotQA 61, MultiRC 75 queries for 300 examples), since "
            "a query's examples are not independent. AUROC ranks by the verdict margin. Paired, on the same test "
            "examples: exact McNemar (right only with A / only with B) where every example is its own query, "
            "else the paired bootstrap over queries; AUROC differences by the paired bootstrap over queries. "
            "Verdicts on a target: \"met\" only when the 95 % interval clears it, \"met at the point estimate, "
            "not shown\" when it straddles it, else \"missed\".", ""]


def _m0_section(m0: Mapping[str, Any]) -> list[str]:
    """M0 against chance on each dataset's test set (``metrics.json → m0_test``)."""
    if not m0:
        return []
    return ["## M0 on the test set", "", *_table(
        ["dataset", "n", "queries", "accuracy [95 % CI]", "vs chance", "p vs chance", "≥ chance + 10 pp",
         "AUROC [95 % CI]"], [
            [ds, s["n"], s.get("queries", s["n"]), f"{s['accuracy']:.3f} {_ci(s['ci95'])}",
             f"{s['above_chance_pp']:+.1f} pp", _p(s["p_value_vs_chance"], s.get("test")), s.get("verdict", ""),
             f"{s['auroc']['auroc']:.3f} {_ci(s['auroc']['ci95'])}" if s.get("auroc") else ""]
            for ds, s in m0.items()])]


def _paired_section(paired: Mapping[str, Any]) -> list[str]:
    """The last round's paired tests per dataset, with Holm's adjustment (``metrics.json → paired``)."""
    if not paired:
        return []
    return ["## Paired comparisons on the last round", "",
            "Holm: the p adjusted over the dataset's paired tests (the issue states two of them in "
            "advance, ReplayDPO vs DPO and CautiousDPO vs SFT-only; read the others through the Holm column).",
            "", *_paired_table(paired)]


def _targets_section(targets: Mapping[str, Any] | None) -> list[str]:
    """The issue's three targets: per dataset, on the point estimate and by the 95 % intervals."""
    if not targets:
        return []
    m = targets["m0_above_chance_plus_10pp"]
    r = targets["replay_ge_dpo_last_round"]
    c = targets["cautious_gt_sft_only"]

    def shown(per_dataset: Mapping[str, Any]) -> str:
        met = sum(s.get("verdict") == "met" for s in per_dataset.values())
        point = sum(s.get("verdict") == "met at the point estimate, not shown" for s in per_dataset.values())
        return f"{met} met, {point} at the point estimate only"

    return ["## The issue's targets", "", *_table(
        ["target", "per dataset", "on the point estimate", "by the 95 % intervals", "verdict"], [
            ["M0 ≥ chance + 10 pp",
             ", ".join(f"{ds} {s['accuracy']:.3f} {_ci(s['ci95'])}" for ds, s in m["per_dataset"].items()),
             f"{m['hits']} of {len(m['per_dataset'])} (needs {m['needed']})", shown(m["per_dataset"]),
             m.get("verdict", "")],
            ["ReplayDPO ≥ DPO, last round",
             ", ".join(_diff_p(ds, s) for ds, s in r["per_dataset"].items()),
             f"{sum(s['met'] for s in r['per_dataset'].values())} of {len(r['per_dataset'])} (needs all)",
             shown(r["per_dataset"]), r.get("verdict", "") if r["per_dataset"] else "not run yet"],
            ["CautiousDPO > SFT-only, last round",
             ", ".join(_diff_p(ds, s) for ds, s in c["per_dataset"].items()),
             f"{c['wins']} of {len(c['per_dataset'])} (needs {c['needed']}; {c['significant_wins']} with p < 0.05)",
             shown(c["per_dataset"]), c.get("verdict", "") if c["per_dataset"] else "not run yet"],
        ])]


def _sweep_sections(metrics: Mapping[str, Any]) -> list[str]:
    """Each sweep's curves per dataset (α, τ, the CautiousDPO variants), with their last-round paired tests."""
    lines: list[str] = []
    sweep_paired = metrics.get("sweep_paired", {})
    for key, title in SWEEP_TITLES.items():
        for ds, curves in metrics.get(key, {}).items():
            lines += _curves(f"{title}, {ds}", curves)
            tests = {name: r for name, r in sweep_paired.get(key, {}).get(ds, {}).items() if r}
            if tests:
                lines += [f"Paired on the last round (p (Holm) over these {len(tests)} test{'s' * (len(tests) > 1)}):", "",
                          *_paired_table({ds: tests})]
    return lines


def _pseudo_label_section(labels: Mapping[str, Any]) -> list[str]:
    """The CautiousDPO cells' accepted pseudo-labels per round: how many, how accurate, who labelled them."""
    if not labels:
        return []
    lines = ["## Accepted pseudo-labels per round (CautiousDPO cells)", "",
             "Accepted of the round's new examples; their accuracy against the gold labels (hidden from the "
             "method); the share labelled \"true\" among them, and the share that is \"true\" by gold; who "
             "labelled them (self: M_{t-1} confident ≥ τ; else the jury); the share M_{t-1} called \"true\" on "
             "the round. A collapse shows as a share \"true\" near 0 or 1 while the gold share stays near 0.5.",
             ""]
    rows = []
    for ds, by_cell in labels.items():
        for name, per_round in by_cell.items():
            for r in per_round:
                acc = r.get("accepted") or 0
                share = (lambda k: f"{r[k] / acc:.2f}" if acc and r.get(k) is not None else "")  # noqa: E731
                rows.append([ds, name, r["round"], f"{acc} of {r.get('n')}", _num(r.get("accuracy")),
                             share("accepted_true"), share("gold_true"), _source(r.get("self")),
                             _source(r.get("jury")), _num(r.get("model_positive_rate"), 2)])
    lines += _table(["dataset", "cell", "round", "accepted", "accuracy", "share \"true\"", "gold share \"true\"",
                     "self: n (accuracy)", "jury: n (accuracy)", "M_{t-1} share \"true\""], rows)
    return lines


def _forgetting_section(forgetting: Mapping[str, Any], sizes: Mapping[str, Any]) -> list[str]:
    """Accuracy after the last round on samples of the splits already trained on, per dataset and method;
    ``sizes`` (``metrics.json → sizes``) holds each dataset's forgetting sample."""
    if not forgetting:
        return []
    lines = ["## Forgetting: accuracy on samples of the splits already trained on, after the last round", "",
             "\"by query\": the interval resamples whole queries (Wilson where each example is its own query). "
             "\"by query, conservative\": the record kept only its summaries (made before each outcome was "
             "stored), so whole queries cannot be resampled; the samples' query ids, rebuilt from the seed, "
             "widen its Wilson interval to the worst-case effective n = n / deff, deff = Σ m² / n over the "
             "queries' sizes m (Kish's design effect at an intra-query correlation of 1, the most a query's "
             "repeats can add to the variance). \"by example\": "
             "no query ids, so the Wilson interval takes the examples as independent. No verdict rests on "
             "these intervals.", ""]
    rows = []
    for ds, by_method in forgetting.items():
        for name, curve in by_method.items():
            if not curve:  # forgetting_per_split: 0
                continue
            last = curve[-1]
            sample = sizes.get(ds, {}).get("forgetting_sample", {})
            rows.append([ds, name, last["round"], *(_forgetting_cell(last, part, sample.get(part, {}))
                                                    for part in ("seen", "earlier"))])
    lines += _table(["dataset", "method", "round", "all splits seen", "splits before the last"], rows)
    return lines


def _downstream_section(qa: Mapping[str, Any]) -> list[str]:
    """Downstream HotpotQA per context (``metrics.json → downstream_stats``), paired against its reference."""
    if not qa.get("intervals"):
        return []
    lines = [f"## Downstream QA (HotpotQA), paired bootstrap against {qa.get('vs')}", ""]
    rows = []
    for name, s in qa["intervals"].items():
        vs = qa.get("paired", {}).get(name, {})
        rows.append([name, s["n"], *[f"{s[k]['mean']:.3f} [{s[k]['low']:.3f}, {s[k]['high']:.3f}]" if k in s else ""
                                     for k in ("support_recall", "em", "f1", "containment")],
                     "; ".join(f"{k.replace('_', ' ')} {vs[k]['diff']:+.3f} p {_p(vs[k]['p_value'])}"
                               for k in ("support_recall", "f1", "containment") if k in vs)])
    lines += ["Support recall: the share of a question's supporting sentences in the reranker's top k (what the "
              "reranker itself achieves); EM / F1 / containment: the generator's answer from those k sentences.", ""]
    lines += _table(["context", "n", "support recall", "EM", "F1", "containment", f"vs {qa.get('vs')}"], rows)
    return lines
