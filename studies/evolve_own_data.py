"""`ragsieve run experiments/evolve_own_data.yaml`: the own-data path and the labeller check (issue #42).

Two questions, each answered on the evolve scale run's splits (same sizes, seed, test sets):

1. **File path vs --dataset.** A benchmark's M0 set is written as the rows a user would give
   (``{id, query_id, query, passage, label}``, git-ignored under ``work/``) and started through
   the file path (:func:`~ragsieve.evolve.store.init_store_from_examples`, the generic
   ``relevance`` template); the same M0 set is started through ``--dataset``
   (:func:`~ragsieve.evolve.store.init_store_from_dataset`, the benchmark's own template). Each
   store's round 0 trains M0 exactly as ``evolve step`` does; each M0 is then served as
   ``evolve:<store>`` and scored on the dataset's fixed test set: accuracy and AUROC with
   intervals, paired by example (exact McNemar, paired bootstrap over queries).
2. **The labeller check on the collapsing datasets** (ANLI, MultiRC, PubMedQA in
   ``results/evolve``). Per dataset, from one M0: ``cautious-dpo`` (the unguarded method) and
   ``checked-cautious-dpo`` (:class:`~ragsieve.evolve.methods.CheckedCautiousDPO`: each round a
   simulated user labels ``check_size`` of the batch, and only labellers whose Wilson interval
   clears the majority share label it). The cells run through :class:`EvolveExperiment` (resumable
   per round, M0 shared); the last round's test AUROC and accuracy are paired, checked vs
   unguarded and each vs M0.

Outputs: ``cells/`` (the evolve study's records), ``file_path/<dataset>.json`` and
``metrics.json`` (both questions, n, intervals, paired tests). Resumable at every level: a
finished store round, round or cell is not redone.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import Field
from rich.console import Console

from studies.common import write_json
from studies.evolve import WORK_GITIGNORE, EvolveExperiment, EvolveExperimentConfig, plan_cells

CHECKED, UNGUARDED = "checked-cautious-dpo", "cautious-dpo"


class EvolveOwnDataConfig(EvolveExperimentConfig):
    """The scale run's settings (so the splits are its splits) plus this study's two knobs."""

    methods: list[str] = [UNGUARDED, CHECKED]
    file_path_dataset: str | None = "fever"  # None: skip question 1
    check_size: int = Field(50, ge=2)  # labelled examples per round for the check (of each batch)
    n_boot: int = Field(2000, ge=0)


class EvolveOwnDataStudy(EvolveExperiment):
    """The study behind ``experiment: evolve_own_data``.

    Example::

        cfg = EvolveOwnDataConfig(datasets=["anli"], file_path_dataset="fever", test_size=300)
        EvolveOwnDataStudy().run(cfg, Path("results/evolve_own_data"), Console())
    """

    Config = EvolveOwnDataConfig

    def run(self, cfg: EvolveOwnDataConfig, out_dir: Path, console: Console) -> dict:
        from ragsieve.evolve.methods import CheckedCautiousDPO

        t0 = time.perf_counter()
        CheckedCautiousDPO.check_size = cfg.check_size  # part of the cells' fingerprint (see _fingerprint)
        if cfg.file_path_dataset:
            self._file_path(cfg, cfg.file_path_dataset, out_dir, console)
        if cfg.datasets:
            super().run(cfg, out_dir, console)
        metrics = self._report(cfg, plan_cells(cfg) if cfg.datasets else [], out_dir, {}, t0)
        self._print(metrics, console)
        return metrics

    # -- question 1: M0 through the file path vs --dataset ----------------------------------
    def _file_path(self, cfg: EvolveOwnDataConfig, ds: str, out_dir: Path, console: Console) -> dict:
        """Both stores' M0 on the same test set (resumable: a finished store round is not redone)."""
        from ragsieve.evolve.store import (EvolveStore, EvolveStoreConfig, init_store, init_store_from_examples,
                                           run_step)
        from ragsieve.prompts.verdicts import GENERIC_TEMPLATE, get_template

        path = out_dir / "file_path" / f"{ds}.json"
        if path.exists():
            return json.loads(path.read_text())
        work = out_dir / "work" / "file_path" / ds
        work.mkdir(parents=True, exist_ok=True)
        (out_dir / "work" / ".gitignore").write_text(WORK_GITIGNORE)  # rows and stores hold dataset text: ignored
        task = self._task(cfg, ds)
        store_cfg = {"llm": cfg.llm, "max_prompt_tokens": cfg.max_prompt_tokens, "batch_size": cfg.eval_batch_size,
                     "m0_train": cfg.m0_train_for(ds), "seed": cfg.seed, "judge_check": False}
        rows = work / "labels.jsonl"
        if not rows.exists():
            rows.write_text("".join(json.dumps({"id": x.id, "query_id": x.query_id, "query": x.query,
                                                "passage": x.passage, "label": x.label}, ensure_ascii=False) + "\n"
                                    for x in task.initial), encoding="utf-8")
        stores = {"dataset": work / "store-dataset", "file": work / "store-file"}
        if not (stores["dataset"] / "evolve.sqlite").exists():
            init_store(stores["dataset"], EvolveStoreConfig(template=ds, **store_cfg), task.initial)
        if not (stores["file"] / "evolve.sqlite").exists():
            init_store_from_examples(stores["file"], rows, EvolveStoreConfig(template=GENERIC_TEMPLATE, **store_cfg))
        generic = get_template(GENERIC_TEMPLATE)
        tests = {"dataset": task.test,
                 "file": [replace(x, fields=generic.fields_for(x.query, x.passage)) for x in task.test]}
        scored: dict[str, Any] = {}
        for name, store in stores.items():
            s = EvolveStore(store)
            try:
                needs_m0 = not s.done_rounds()
            finally:
                s.close()
            if needs_m0:
                console.print(f"  {ds} via {name}: training M0 on {len(task.initial)} examples (store round 0)")
                report = run_step(store)
                console.print(f"  {report.summary()}")
            scored[name] = self._score_store(store, tests[name])
        result = {"dataset": ds, "n_sft": len(task.initial), "test_ids": [x.id for x in task.test],
                  "test_query_ids": [x.query_id for x in task.test], "templates": {"dataset": ds, "file": "relevance"},
                  "scores": scored}
        write_json(path, result)
        return result

    @staticmethod
    def _score_store(store: Path, test) -> dict:
        """The store's model as served (``evolve:<store>``) on the test examples."""
        from ragsieve.registry import load_reranker
        from studies.evolve import score_examples

        start = time.perf_counter()
        ranker = load_reranker(f"evolve:{store}")
        out = score_examples(ranker, test)
        out["seconds"] = round(time.perf_counter() - start, 1)
        return out

    # -- cells: the checked method needs the jury too -----------------------------------------
    def _run_cell(self, cfg, cell, task, m0, base, judges, out_dir: Path, console: Console) -> dict:
        if cell.method.kind == CHECKED and not judges:  # EvolveExperiment builds judges for cautious-dpo only
            judges = self._judges(cfg, task, console)
        return super()._run_cell(cfg, cell, task, m0, base, judges, out_dir, console)

    @staticmethod
    def _fingerprint(cfg, cell, task) -> str:
        import hashlib

        key = EvolveExperiment._fingerprint(cfg, cell, task)
        if cell.method.kind != CHECKED:
            return key
        extra = {"judges": [j.model_dump() for j in cfg.judges], "check_size": cfg.check_size}
        return hashlib.sha1(json.dumps([key, extra], sort_keys=True).encode()).hexdigest()[:16]

    # -- report ----------------------------------------------------------------------------------
    def _report(self, cfg, cells, out_dir: Path, sizes: dict, t0: float, sample_queries: dict | None = None) -> dict:
        """metrics.json from whatever is finished: file path vs --dataset, and checked vs unguarded (the
        forgetting samples' ``sample_queries`` are not used here)."""
        metrics: dict[str, Any] = {"experiment": "evolve_own_data", "file_path": {}, "labeller_check": {},
                                   "settings": {"check_size": cfg.check_size, "tau": cfg.tau,
                                                "judges": [j.label for j in cfg.judges], "test_size": cfg.test_size}}
        for path in sorted((out_dir / "file_path").glob("*.json")):
            metrics["file_path"][path.stem] = file_path_comparison(json.loads(path.read_text()), cfg.n_boot)
        for ds in cfg.datasets:
            folder = out_dir / "cells" / ds
            found = {name: json.loads((folder / f"{name}.json").read_text())
                     for name in (UNGUARDED, CHECKED) if (folder / f"{name}.json").exists()}
            m0_path = folder / "_m0.json"
            if found and m0_path.exists():
                metrics["labeller_check"][ds] = check_comparison(json.loads(m0_path.read_text()), found, cfg.n_boot)
        metrics["seconds"] = {"this_run": round(time.perf_counter() - t0, 1)}
        metrics["cells"] = {"finished": sum(self._cell_path(out_dir, c).exists() for c in cells), "planned": len(cells)}
        write_json(out_dir / "metrics.json", metrics)
        return metrics

    @staticmethod
    def _print(metrics: dict, console: Console) -> None:
        for ds, r in metrics.get("file_path", {}).items():
            f, d, p = r["file"], r["dataset"], r["accuracy_paired"]
            console.print(f"{ds} M0: file path {f['accuracy']:.3f} {f['ci95']} vs --dataset {d['accuracy']:.3f} "
                          f"{d['ci95']} (n = {r['n']}): {p['diff']:+.3f} [{p['low']:+.3f}, {p['high']:+.3f}], "
                          f"McNemar p = {r['mcnemar']['p_value']}")
        for ds, r in metrics.get("labeller_check", {}).items():
            a = r.get("auroc_checked_vs_unguarded") or {}
            if a.get("diff") is not None:
                console.print(f"{ds} last round AUROC checked − unguarded: {a['diff']:+.3f} "
                              f"[{a['low']}, {a['high']}], p = {a['p_value']} (n = {a['n']})")


def _accuracy(correct: list[int], groups: list[str], n_boot: int) -> dict:
    from ragsieve.eval.stats import proportion_interval

    acc, low, high = proportion_interval(correct, groups, n_boot=n_boot)
    return {"n": len(correct), "accuracy": round(acc, 4), "ci95": [round(low, 4), round(high, 4)]}


def _paired(a: dict, b: dict, labels: list[int], groups: list[str], n_boot: int) -> dict:
    """A vs B on the same examples: accuracy (exact McNemar + paired bootstrap over queries) and AUROC."""
    from ragsieve.eval.stats import auroc_difference, mcnemar_exact, paired_bootstrap

    ca, cb = [int(c) for c in a["correct"]], [int(c) for c in b["correct"]]
    m = mcnemar_exact(ca, cb)
    d = paired_bootstrap(ca, cb, groups=groups, n_boot=n_boot)
    import numpy as np

    auroc = auroc_difference(np.array(labels), np.array(a["margins"]), np.array(b["margins"]), np.array(groups),
                             n_boot)
    return {"mcnemar": {**m.to_dict(), "p_value": float(f"{m.p_value:.3g}")},
            "accuracy_paired": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.to_dict().items()},
            "auroc_paired": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in auroc.items()}}


def _labels(record: dict) -> list[int]:
    """Gold labels from right/wrong and the verdicts: label = pred if right else 1 − pred."""
    return [int(p) if c == "1" else 1 - int(p) for p, c in zip(record["pred"], record["correct"])]


def file_path_comparison(result: dict, n_boot: int) -> dict:
    """M0 through the file path vs through --dataset on the same test examples."""
    from ragsieve.eval.stats import auroc_interval
    import numpy as np

    groups = result["test_query_ids"]
    out: dict[str, Any] = {"n": len(groups), "queries": len(set(groups)), "templates": result["templates"]}
    labels = _labels(result["scores"]["dataset"])
    for name in ("file", "dataset"):
        s = result["scores"][name]
        auroc = auroc_interval(np.array(labels), np.array(s["margins"]), np.array(groups), n_boot)
        out[name] = {**_accuracy([int(c) for c in s["correct"]], groups, n_boot), "auroc": auroc["auroc"],
                     "auroc_ci95": [auroc["low"], auroc["high"]], "positive_rate": s.get("positive_rate")}
    out.update(_paired(result["scores"]["file"], result["scores"]["dataset"], labels, groups, n_boot))
    return out


def check_comparison(m0: dict, cells: dict[str, dict], n_boot: int) -> dict:
    """Last-round test outcomes of the checked and unguarded cells, paired with each other and with M0,
    and what the check decided each round (labellers used, accepted labels, skipped rounds)."""
    groups = m0.get("test_query_ids") or m0["test_ids"]
    base = m0["test"]
    labels = _labels(base)
    out: dict[str, Any] = {"n": len(labels), "queries": len(set(groups)),
                           "m0": _accuracy([int(c) for c in base["correct"]], groups, n_boot)}
    last = {}
    for name, cell in cells.items():
        test = cell["rounds"][-1]["test"]
        last[name] = test
        out[name] = {**_accuracy([int(c) for c in test["correct"]], groups, n_boot), "auroc": test.get("auroc"),
                     "positive_rate": test.get("positive_rate"),
                     "rounds": [{"round": r["round"], "accepted": r["labels"].get("accepted"),
                                 "label_accuracy": r["labels"].get("accuracy"),
                                 "used": (r["labels"].get("labeller_check") or {}).get("used"),
                                 "skipped": r["labels"].get("skipped")} for r in cell["rounds"]]}
        out[f"{name}_vs_m0"] = _paired(test, base, labels, groups, n_boot)
    if CHECKED in last and UNGUARDED in last:
        paired = _paired(last[CHECKED], last[UNGUARDED], labels, groups, n_boot)
        out["checked_vs_unguarded"] = paired
        out["auroc_checked_vs_unguarded"] = paired["auroc_paired"]
    return out
