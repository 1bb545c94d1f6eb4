"""`ragsieve run experiments/evolve_scale.yaml`: every method over four rounds on six datasets.

Per dataset: the SFT set trains M0 once (shared by all methods, kept under
``<out_dir>/work/<dataset>/m0``); then each (dataset, method) cell starts from M0 and runs
the rounds (:func:`~ragsieve.evolve.methods.evolve_round`). A finished cell is saved to
``<out_dir>/cells/<dataset>/<cell>.json`` and skipped when the experiment is rerun, so an
interrupted run loses at most the cell in progress. Cells: the main methods on every
dataset, the ReplayDPO α sweep and the CautiousDPO ablations on the configured datasets
(α = the main α reuses ``replay-dpo``; α = 1 is exactly ``dpo`` and reuses it).

The last round's batch is evaluated and labelled (its pseudo-label accuracy counts) but
M_R is trained only where something uses it: the HotpotQA downstream QA, which ranks the
sentences of held-out questions with each method's final reranker, keeps the top k and
lets the generator LLM answer (EM / F1 by :mod:`ragsieve.eval.qa`).

Outputs: ``metrics.json`` (``by_dataset``, ``alpha_sweep``, ``ablation``,
``pseudo_label_accuracy``, ``downstream``, ``targets``, sizes and timings) and
``accuracy_<dataset>.png`` (accuracy by round, one line per method).

At scale (``test_size`` > 0, issue #16; ``experiments/evolve_scale*.yaml``):

* a fixed test set per dataset, query-disjoint from M0's data and every round
  (:func:`~ragsieve.evolve.tasks.select_test`), is scored by M0 once
  (``cells/<dataset>/_m0.json``) and by M_t after every round of every cell; each stores
  its right/wrong per example (``correct``, aligned with the cell's ``test_ids``), so any
  two cells compare by exact McNemar (``paired``, ``targets`` in ``metrics.json``;
  :mod:`studies.evolve_stats`). Samples of the splits already trained on
  (``forgetting_per_split`` each) show forgetting.
* ``m0: mixed`` trains one M0 on the SFT sets of all datasets (each in its own template).
* Cells resume mid-cell: each finished round writes ``cells/<dataset>/<cell>/round-<t>.json``
  (small, committable: metrics, pseudo-labels, the round's pairs) after its adapter is
  saved to ``work/<dataset>/<cell>/round-<t>`` (git-ignored, like M0 under ``work/<dataset>/m0``, whose
  sha256 is recorded in ``artifacts.json``; :data:`WORK_GITIGNORE`). A rerun rebuilds M_t from M0
  and those adapters and continues at round t + 1; a round whose adapter is missing (a
  fresh clone) is redone, with every round after it.
* ``tau_sweep`` adds CautiousDPO cells with other confidence gates, like ``alpha_sweep``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Literal, Union

from pydantic import Field
from rich.console import Console
from rich.table import Table

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.evolve.judges import JudgeSpec
from ragsieve.evolve.methods import MethodConfig
from ragsieve.evolve.train import VerdictTrainConfig
from ragsieve.models.specs import DEFAULT_LLM
from studies.common import write_json

DOWNSTREAM_DATASET = "hotpotqa-distractor"
MAIN_METHODS = ("sft-only", "sft", "dpo", "replay-dpo", "cautious-dpo")
# The paired comparisons (A vs B, exact McNemar on the last round's test outcomes),
# plus the SFT-vs-DPO and replay-vs-SFT contrasts that explain them.
# The two comparisons first; then each method against the frozen-M0 reference (sft-only) and
# DPO against SFT on the same rounds' data, so a claim like "DPO beats M0" carries its own p-value.
PAIRED_TESTS = (("replay-dpo", "dpo"), ("cautious-dpo", "sft-only"), ("dpo", "sft"), ("sft", "sft-only"),
                ("dpo", "sft-only"), ("replay-dpo", "sft-only"))
# CautiousDPO variants: all three on `ablation_datasets` (two ablations and the collapse guard),
# the guard alone on `guard_datasets`.
ABLATIONS = {"no-gating": {"gating": False}, "no-jury": {"jury": False}, "balanced": {"balance": True}}
# Each sweep's cells are paired (same test examples, last round) with these reference cells: α < 1
# with DPO (α = 1, no replay); a τ or a CautiousDPO variant with the main CautiousDPO cell and with
# the frozen M0 (the CautiousDPO target), so "the gate / the jury / balancing matters" is a test.
SWEEP_REFERENCES = {"alpha_sweep": ("dpo",), "tau_sweep": ("cautious-dpo", "sft-only"),
                    "ablation": ("cautious-dpo", "sft-only")}


class RoundSizes(StrictConfig):
    initial: int = Field(128, ge=1)  # labelled SFT set → M0
    per_round: int = Field(64, ge=1)  # D_t, t = 1..rounds
    balanced: Union[bool, None] = None  # None: the experiment's `balanced` (PubMedQA lacks "no"s)


class DownstreamConfig(StrictConfig):
    enabled: bool = True
    held_out_questions: int = 20  # HotpotQA questions kept out of every round
    # Cells whose final reranker answers the held-out questions (None = every HotpotQA cell).
    # Each costs ≈ 40 sentence verdicts + one generation per question, so sweeps skip it at scale.
    methods: Union[list[str], None] = None
    # The reference reranker of the same pipeline ("" = none): the project's base cross-encoder.
    base_reranker: str = ""
    top_k: int = 3
    generator: str = DEFAULT_LLM
    max_new_tokens: int = 16
    max_prompt_tokens: int = 1024
    batch_size: int = 8


class EvolveExperimentConfig(StrictConfig):
    llm: str = DEFAULT_LLM
    datasets: list[str] = ["anli", "fever", "hotpotqa-distractor", "multirc", "pubmedqa", "bioasq"]
    methods: list[str] = list(MAIN_METHODS)
    rounds: int = Field(4, ge=1)
    sizes: RoundSizes = RoundSizes()
    size_overrides: dict[str, RoundSizes] = {}
    balanced: bool = True
    max_prompt_tokens: int = 320
    eval_batch_size: int = 8
    m0_train: VerdictTrainConfig = VerdictTrainConfig(lr=2e-4, epochs=2)
    # Per-dataset changes to m0_train (e.g. {bioasq: {lr: 5.0e-4, epochs: 4}}, chosen on a dev set by
    # `experiment: evolve_m0_sweep`); a dataset without one keeps m0_train, its M0 and cells unchanged.
    m0_train_overrides: dict[str, dict[str, Any]] = {}
    train: VerdictTrainConfig = VerdictTrainConfig()
    alpha: float = 0.7  # ReplayDPO's share of new pairs
    tau: float = 0.9  # CautiousDPO confidence gate
    cautious_alpha: float = 1.0  # CautiousDPO replay share (1 = new pairs only)
    judges: list[JudgeSpec] = [
        JudgeSpec(kind="llm", model=DEFAULT_LLM),
        JudgeSpec(kind="reranker", model="bi-encoder"),
    ]
    alpha_sweep: list[float] = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    alpha_sweep_datasets: list[str] = []
    tau_sweep: list[float] = []  # CautiousDPO gates; tau = `tau` reuses the cautious-dpo cell
    tau_sweep_datasets: list[str] = []
    ablation_datasets: list[str] = []
    # Datasets that get the collapse guard only (the `cautious-dpo:balanced` cell, not the two ablations):
    # a cheap check that balanced acceptance stops a collapse seen there.
    guard_datasets: list[str] = []
    # Scale (issue #16): a fixed balanced test set per dataset scored after M0 and every round
    # (0 = off: the small study's per-round evaluation only).
    test_size: int = 0
    balanced_test: bool = True
    forgetting_per_split: int = 0  # per split already trained on (SFT set, D_1..D_t), after every round
    m0: Literal["per-dataset", "mixed"] = "per-dataset"
    # Another run's out_dir (e.g. stage 0 for the mixed-M0 twin): this run's M0 against that run's on the
    # same test examples, exact McNemar per dataset (metrics.json → m0_vs_other)
    compare_m0_to: Union[str, None] = None
    hotpot_source: Literal["sample100", "all"] = "sample100"
    # Per-round adapters (≈ 20 MB each for SmolLM2 r16) are needed only to resume a cell
    # mid-way; once its JSON is written they are dropped unless kept.
    keep_adapters: bool = False
    # "auto": train M_R (after the last evaluation) only where the downstream QA uses it.
    train_last_round: Union[bool, Literal["auto"]] = "auto"
    downstream: DownstreamConfig = DownstreamConfig()
    # M0's training saves its adapter and optimizer every this many steps (work/<ds>/m0.checkpoint),
    # so a kill loses at most that many steps of a long (mixed) M0; 0 = none. Not part of any fingerprint.
    checkpoint_steps: int = Field(25, ge=0)
    # torch CPU threads (0 = torch's default). On a 2-core machine shared with other jobs,
    # 1 thread ran a SmolLM2 step 2.7x faster than 2 oversubscribed ones (17 s vs 47 s).
    threads: int = 0
    seed: int = 0
    data_dir: Union[str, None] = None

    def sizes_for(self, dataset: str) -> RoundSizes:
        return self.size_overrides.get(dataset, self.sizes)

    def m0_train_for(self, dataset: str) -> VerdictTrainConfig:
        """M0's recipe for ``dataset`` (m0_train with its override applied)."""
        override = self.m0_train_overrides.get(dataset)
        return VerdictTrainConfig(**{**self.m0_train.model_dump(), **override}) if override else self.m0_train

    def balanced_for(self, dataset: str) -> bool:
        size = self.sizes_for(dataset)
        return self.balanced if size.balanced is None else size.balanced

    # Settings that name datasets (lists, or dicts keyed by dataset): each must name one of the run's.
    DATASET_KEYED: ClassVar[tuple[str, ...]] = (
        "alpha_sweep_datasets", "tau_sweep_datasets", "ablation_datasets", "guard_datasets", "m0_train_overrides")

    def check(self) -> None:
        """One-line errors for settings that would only fail hours into a run."""
        for name in self.DATASET_KEYED:
            stray = [d for d in getattr(self, name) if d not in self.datasets]
            if stray:
                raise RagsieveError(f"{name} {stray} are not in datasets {self.datasets}")
        if self.test_size and self.test_size < 2:
            raise RagsieveError(f"test_size must be 0 (off) or >= 2, got {self.test_size}")
        if self.forgetting_per_split and not self.test_size:
            raise RagsieveError("forgetting_per_split needs the test-set evaluation (test_size > 0)")
        if self.m0_train_overrides and self.m0 == "mixed":
            raise RagsieveError("m0_train_overrides need m0: per-dataset (a mixed M0 has one recipe)")
        for ds in self.m0_train_overrides:
            self.m0_train_for(ds)  # a misspelt field fails here, not when that dataset's turn comes
        if self.m0 == "mixed" and not self.test_size:
            raise RagsieveError("m0: mixed is measured on the test sets; set test_size > 0")
        if not all(0.5 <= t <= 1.0 for t in self.tau_sweep):
            raise RagsieveError(f"tau_sweep values must lie in [0.5, 1] (a confidence), got {self.tau_sweep}")


@dataclass(frozen=True)
class M0:
    dir: Path  # the SFT adapter every cell of a dataset starts from
    info: dict

    @cached_property
    def weights(self) -> str:
        """Which adapter this is. Records made with M0 carry it: retraining M0 from the same data and
        seed does not reproduce it on CPU (FEVER, 1 → 2 threads: 35 of 300 test verdicts changed)."""
        from ragsieve.rerank.shipped import weights_key

        return weights_key(self.dir, "adapter_model.safetensors")


class IdentityTargets:
    """Stands in for :class:`~ragsieve.models.verdict.VerdictTokens` when each SFT label is
    already the target token id (the mixed M0: every template has its own label words)."""

    @staticmethod
    def id_for(label: int) -> int:
        return int(label)


def score_examples(ranker, examples) -> dict[str, Any]:
    """Right/wrong of ``ranker``'s verdicts per example (0/1 strings, in ``examples`` order), the summary,
    and the margins behind the verdicts: a reranker ranks by them, so AUROC (threshold-free) says
    whether a model separates the labels even when its verdict threshold is off."""
    from studies.evolve_stats import score_summary, threshold_free

    verdicts = ranker.predict(examples)
    pred = [int(p) for p in verdicts.predictions]
    correct = [int(p == x.label) for p, x in zip(pred, examples)]
    # log P(true) − log P(false): ranks like the score, without the ties rounding a saturated P(true) makes
    margins = [round(float(m), 4) for m in verdicts.logp_true - verdicts.logp_false]
    return {**score_summary(correct, pred), **threshold_free([x.label for x in examples], margins),
            "correct": "".join(map(str, correct)), "pred": "".join(map(str, pred)), "margins": margins}


def forgetting_samples(task, per_split: int, seed: int) -> list[list]:
    """A fixed seeded sample of each split (0 = the SFT set, t = D_t), the same for every cell."""
    import random

    if not per_split:
        return []
    out = []
    for s, split in enumerate(task.splits()):
        ordered = sorted(split, key=lambda x: x.id)
        out.append(random.Random(f"{seed}:forgetting:{s}").sample(ordered, min(per_split, len(ordered))))
    return out


def forgetting_eval(ranker, samples: list[list], upto: int, cache: dict, version: int) -> dict[str, Any]:
    """M_t on the samples of splits 0..t; ``cache`` keeps outcomes per (model version, split).

    Each example's outcome is kept, and the intervals resample whole queries where a query holds
    several sampled examples (:func:`~studies.evolve_stats.forgetting_summary`); the record
    that holds these rows stores the samples' ids and query ids (:func:`forgetting_ids`).
    """
    from studies.evolve_stats import forgetting_summary

    todo = [s for s in range(upto + 1) if (version, s) not in cache]
    if todo:
        flat = [x for s in todo for x in samples[s]]
        correct = score_examples(ranker, flat)["correct"] if flat else ""
        pos = 0
        for s in todo:
            cache[(version, s)] = [int(c) for c in correct[pos : pos + len(samples[s])]]
            pos += len(samples[s])
    return forgetting_summary([cache[(version, s)] for s in range(upto + 1)],
                              [[x.query_id for x in split] for split in samples], upto)


def forgetting_ids(samples: list[list]) -> dict[str, list[list[str]]]:
    """The forgetting samples' ids and query ids per split, stored once per record (M0's, each cell's):
    the report resamples whole queries from them (:func:`~studies.evolve_stats.forgetting_curve`)."""
    return {"forgetting_ids": [[x.id for x in split] for split in samples],
            "forgetting_query_ids": [[x.query_id for x in split] for split in samples]}


@dataclass(frozen=True)
class Cell:
    dataset: str
    name: str  # file stem: "dpo", "replay-dpo@0.5", "cautious-dpo:no-gating"
    method: MethodConfig


def plan_cells(cfg: EvolveExperimentConfig) -> list[Cell]:
    """Every (dataset, method) cell of the matrix, each once, in run order."""
    from ragsieve.evolve.methods import METHODS

    unknown = [m for m in cfg.methods if m not in METHODS]
    if unknown:
        raise RagsieveError(f"unknown method(s) {unknown}; known: {', '.join(METHODS)}")
    cfg.check()

    def main(name: str) -> MethodConfig:
        extra = {"replay-dpo": {"alpha": cfg.alpha}, "cautious-dpo": {"alpha": cfg.cautious_alpha, "tau": cfg.tau}}
        return MethodConfig(kind=name, **extra.get(name, {}))

    cells: dict[tuple[str, str], Cell] = {}
    for ds in cfg.datasets:
        for name in cfg.methods:
            cells[(ds, name)] = Cell(ds, name, main(name))
        if ds in cfg.alpha_sweep_datasets:
            for alpha in cfg.alpha_sweep:
                name = _alpha_cell(cfg, alpha)
                method = main("dpo") if name == "dpo" else MethodConfig(kind="replay-dpo", alpha=alpha)
                cells.setdefault((ds, name), Cell(ds, name, method))
        if ds in cfg.tau_sweep_datasets:
            for tau in cfg.tau_sweep:
                name = _tau_cell(cfg, tau)
                cells.setdefault((ds, name), Cell(ds, name, main("cautious-dpo").model_copy(update={"tau": tau})))
        variants = _ablation_variants(cfg, ds)
        if variants:
            cells.setdefault((ds, "cautious-dpo"), Cell(ds, "cautious-dpo", main("cautious-dpo")))
        for variant in variants:
            name = f"cautious-dpo:{variant}"
            cells[(ds, name)] = Cell(ds, name, main("cautious-dpo").model_copy(update=ABLATIONS[variant]))
    return list(cells.values())


def _ablation_variants(cfg: EvolveExperimentConfig, dataset: str) -> list[str]:
    """The CautiousDPO variants run on ``dataset``: all on `ablation_datasets`, the guard on `guard_datasets`."""
    if dataset in cfg.ablation_datasets:
        return list(ABLATIONS)
    return ["balanced"] if dataset in cfg.guard_datasets else []


def _tau_cell(cfg: EvolveExperimentConfig, tau: float) -> str:
    return "cautious-dpo" if abs(tau - cfg.tau) < 1e-9 else f"cautious-dpo@tau={tau:g}"


def _alpha_cell(cfg: EvolveExperimentConfig, alpha: float) -> str:
    if alpha >= 1.0:
        return "dpo"
    if abs(alpha - cfg.alpha) < 1e-9:
        return "replay-dpo"
    return f"replay-dpo@{alpha:g}"


def sweep_cells(cfg: EvolveExperimentConfig) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """Sweep → dataset → [(label, cell name)]: the cells behind each sweep's curves and paired tests."""
    return {
        "alpha_sweep": {ds: [(f"{a:g}", _alpha_cell(cfg, a)) for a in cfg.alpha_sweep]
                        for ds in cfg.alpha_sweep_datasets},
        "tau_sweep": {ds: [(f"{t:g}", _tau_cell(cfg, t)) for t in cfg.tau_sweep] for ds in cfg.tau_sweep_datasets},
        "ablation": {ds: [("cautious-dpo", "cautious-dpo")] + [(v, f"cautious-dpo:{v}") for v in variants]
                     for ds in cfg.datasets if (variants := _ablation_variants(cfg, ds))},
    }


# work/ holds adapters, all git-ignored: training outputs are not committed (round adapters, ≈ 20 MB
# each, are dropped when their cell finishes; M0's sha256 is in artifacts.json). M0's training record
# and its verdicts on D_1 (small JSON) are committed.
WORK_GITIGNORE = "*\n!.gitignore\n!*/\n!*/m0.json\n!*/m0_d1.json\n*.checkpoint/\n"


class EvolveExperiment:
    """The experiment behind ``experiment: evolve``.

    Example::

        cfg = EvolveExperimentConfig(datasets=["bioasq"], methods=["sft-only", "dpo"])
        EvolveExperiment().run(cfg, Path("results/evolve"), Console())
    """

    Config = EvolveExperimentConfig

    def run(self, cfg: EvolveExperimentConfig, out_dir: Path, console: Console) -> dict:
        t0 = time.perf_counter()
        cells = plan_cells(cfg)  # validates the config before any work
        if cfg.threads:
            import torch

            torch.set_num_threads(cfg.threads)
        work = out_dir / "work"
        work.mkdir(parents=True, exist_ok=True)
        (work / ".gitignore").write_text(WORK_GITIGNORE)
        # Built up front: a mixed M0 trains on every dataset's SFT set.
        tasks = {ds: self._task(cfg, ds) for ds in cfg.datasets}
        sizes, sample_queries = self._sizes(tasks, cfg), self._forgetting_query_ids(tasks, cfg)
        self._generator = self._hotpot = None
        for ds, task in tasks.items():
            ds_cells = [c for c in cells if c.dataset == ds]
            self._check_finished(cfg, ds_cells, task, out_dir)
            pending = [c for c in ds_cells if not self._cell_path(out_dir, c).exists()]
            console.print(f"[bold]{ds}[/]: {len(pending)} cell(s) to run, sizes {task.sizes()}")
            folder, info = self._m0_paths(cfg, ds, work)
            record = out_dir / "cells" / ds / "_m0.json"
            base = None
            if pending:  # M0 once per dataset, shared by its cells
                m0 = self._ensure_m0(cfg, tasks, ds, work, console)
                self._check_same_m0([c for c in ds_cells if c not in pending], m0, out_dir)
                base = self._m0_eval(cfg, task, m0, out_dir, console) if cfg.test_size else None
            elif cfg.test_size and folder.exists() and info.exists() and record.exists() and "m0_weights" not in \
                    json.loads(record.read_text()):  # recorded before weights were: check against M0 and add them
                self._m0_eval(cfg, task, M0(folder, json.loads(info.read_text())), out_dir, console)
            judges = None
            for cell in pending:
                if cell.method.kind == "cautious-dpo" and judges is None:
                    judges = self._judges(cfg, task, console)
                result = self._run_cell(cfg, cell, task, m0, base, judges or [], out_dir, console)
                write_json(self._cell_path(out_dir, cell), result)
                self._drop_partial(cfg, out_dir, cell)
                # metrics.json and the plots follow every finished cell: a run spanning sessions is
                # committed (and read) part-way
                self._report(cfg, cells, out_dir, sizes, t0, sample_queries)
            if self._downstream(cfg, ds) and not (out_dir / "cells" / ds / "_baselines.json").exists():
                write_json(out_dir / "cells" / ds / "_baselines.json", self._baselines(cfg, task, console))
        metrics = self._report(cfg, cells, out_dir, sizes, t0, sample_queries)
        self._print(metrics, console)
        console.print(f"wrote {out_dir / 'metrics.json'} in {metrics['seconds']['this_run']:.0f}s")
        return metrics

    def report(self, cfg: EvolveExperimentConfig, out_dir: Path, console: Console) -> dict:
        """metrics.json, TABLES.md and the plots from the cells finished so far; runs nothing.

        For a run that spans sessions or machines: the report of the committed cells under the
        committed config (a run writes it too, after every cell, under the config it was started with).
        """
        t0 = time.perf_counter()
        cells = plan_cells(cfg)
        tasks = {ds: self._task(cfg, ds) for ds in cfg.datasets}
        for ds, task in tasks.items():  # the same check as a run: a cell of other settings is not mixed in
            self._check_finished(cfg, [c for c in cells if c.dataset == ds], task, out_dir)
        metrics = self._report(cfg, cells, out_dir, self._sizes(tasks, cfg), t0, self._forgetting_query_ids(tasks, cfg))
        self._print(metrics, console)
        console.print(f"wrote {out_dir / 'metrics.json'} from {metrics['cells']['finished']} of "
                      f"{metrics['cells']['planned']} cells")
        return metrics

    @staticmethod
    def _sizes(tasks: dict, cfg: EvolveExperimentConfig) -> dict:
        """Each dataset's split sizes, and how many queries its forgetting samples hold after the last round
        (all splits seen, and those before the last): fewer queries than examples make by-example intervals
        optimistic."""
        def forgetting_sample(task) -> dict[str, Any]:
            samples = forgetting_samples(task, cfg.forgetting_per_split, cfg.seed)
            return {name: {"n": len(rows), "queries": len({x.query_id for x in rows})}
                    for name, rows in (("seen", [x for s in samples for x in s]),
                                       ("earlier", [x for s in samples[:-1] for x in s]))}

        return {
            ds: {**t.sizes(), "split": t.meta["split"], "balanced": t.meta["balanced"],
                 "held_out_questions": len(t.held_out_query_ids),
                 **({"forgetting_sample": forgetting_sample(t)} if cfg.forgetting_per_split else {})}
            for ds, t in tasks.items()
        }

    @staticmethod
    def _forgetting_query_ids(tasks: dict, cfg: EvolveExperimentConfig) -> dict[str, list[list[str]]]:
        """Each dataset's forgetting samples' query ids per split, rebuilt from the seed: they widen an older
        record's intervals (kept before each outcome and the ids were) to query level
        (:func:`~studies.evolve_stats.conservative_forgetting`)."""
        return {ds: [[x.query_id for x in split] for split in forgetting_samples(t, cfg.forgetting_per_split, cfg.seed)]
                for ds, t in tasks.items()}

    def _known_m0(self, cfg, work: Path) -> dict:
        """M0's training record (``m0.json``) for every dataset with an M0 so far, this run's or earlier."""
        paths = {ds: self._m0_paths(cfg, ds, work)[1] for ds in cfg.datasets}
        return {ds: json.loads(path.read_text()) for ds, path in paths.items() if path.exists()}

    def _report(self, cfg, cells: list[Cell], out_dir: Path, sizes: dict, t0: float,
                sample_queries: dict | None = None) -> dict:
        """metrics.json and the plots from the finished cells (all of them at the end of a run)."""
        metrics = self._aggregate(cfg, cells, out_dir, sizes, self._known_m0(cfg, out_dir / "work"), sample_queries)
        metrics["seconds"]["this_run"] = round(time.perf_counter() - t0, 1)
        metrics["cells"] = {"finished": sum(self._cell_path(out_dir, c).exists() for c in cells), "planned": len(cells)}
        write_json(out_dir / "metrics.json", metrics)
        if cfg.test_size:
            from studies.evolve_tables import markdown_tables

            (out_dir / "TABLES.md").write_text(markdown_tables(metrics))
        curves = metrics["test_curves"] if cfg.test_size else metrics["by_dataset"]
        for ds in cfg.datasets:
            if curves.get(ds):  # part-way, a dataset not reached yet keeps its plot
                plot_accuracy_by_round(curves[ds], out_dir / f"accuracy_{ds}.png", ds)
        for ds, by_alpha in metrics["alpha_sweep"].items():
            plot_accuracy_by_round({f"α = {a}": c for a, c in by_alpha.items()}, out_dir / f"alpha_sweep_{ds}.png",
                                   f"{ds}: ReplayDPO, share α of new pairs")
        for ds, by_tau in metrics.get("tau_sweep", {}).items():
            plot_accuracy_by_round({f"τ = {t}": c for t, c in by_tau.items()}, out_dir / f"tau_sweep_{ds}.png",
                                   f"{ds}: CautiousDPO, confidence gate τ")
        for ds, by_variant in metrics["ablation"].items():
            plot_accuracy_by_round(by_variant, out_dir / f"ablation_{ds}.png", f"{ds}: CautiousDPO variants")
        return metrics

    # -- pieces -------------------------------------------------------------------
    @staticmethod
    def _downstream(cfg: EvolveExperimentConfig, ds: str, cell: str | None = None) -> bool:
        """Whether ``ds`` holds out downstream questions (and, given a cell, whether that cell answers them)."""
        d = cfg.downstream
        return d.enabled and ds == DOWNSTREAM_DATASET and (cell is None or d.methods is None or cell in d.methods)

    @staticmethod
    def _cell_path(out_dir: Path, cell: Cell) -> Path:
        return out_dir / "cells" / cell.dataset / f"{cell.name}.json"

    def _task(self, cfg: EvolveExperimentConfig, ds: str):
        from ragsieve.evolve.tasks import build_task_rounds

        size = cfg.sizes_for(ds)
        return build_task_rounds(
            ds, initial_size=size.initial, round_size=size.per_round, rounds=cfg.rounds, seed=cfg.seed,
            balanced=cfg.balanced_for(ds),
            held_out_queries=cfg.downstream.held_out_questions if self._downstream(cfg, ds) else 0,
            test_size=cfg.test_size, balanced_test=cfg.balanced_test, hotpot_source=cfg.hotpot_source,
            data_dir=cfg.data_dir,
        )

    def _ranker(self, cfg: EvolveExperimentConfig, ds: str, adapters=(), llm=None):
        from ragsieve.rerank.pointwise import PointwiseLLMReranker

        return PointwiseLLMReranker(
            ds, llm or cfg.llm, adapters=adapters, max_prompt_tokens=cfg.max_prompt_tokens,
            batch_size=cfg.eval_batch_size,
        )

    @staticmethod
    def _m0_paths(cfg: EvolveExperimentConfig, ds: str, work: Path) -> tuple[Path, Path]:
        folder = work / ("_mixed" if cfg.m0 == "mixed" else ds)
        return folder / "m0", folder / "m0.json"

    def _ensure_m0(self, cfg, tasks: dict, ds: str, work: Path, console: Console) -> "M0":
        """M0 = SFT on the labelled set(s), trained once (atomic adapter folder) and reused."""
        from ragsieve.evolve.train import train_round
        from ragsieve.models.training import TrainingCheckpoint

        m0_dir, info_path = self._m0_paths(cfg, ds, work)
        fingerprint = self._m0_fingerprint(cfg, tasks if cfg.m0 == "mixed" else {ds: tasks[ds]})
        if info_path.exists() and (m0_dir / "adapter_config.json").exists():
            info = json.loads(info_path.read_text())
            if info.get("fingerprint", fingerprint) != fingerprint:
                raise RagsieveError(f"{m0_dir} was trained under other settings or data; use another out_dir")
            return M0(m0_dir, info)
        if info_path.exists():
            console.print(f"  [yellow]{m0_dir} is missing (weights are not committed): retraining M0; the finished "
                          "cells are kept only if it matches the M0 they were scored with[/]")
        config = (cfg.m0_train if cfg.m0 == "mixed" else cfg.m0_train_for(ds)).model_copy(update={"seed": cfg.seed})
        checkpoint = (TrainingCheckpoint(m0_dir.parent / "m0.checkpoint", cfg.checkpoint_steps, tag=fingerprint)
                      if cfg.checkpoint_steps else None)
        if cfg.m0 == "mixed":
            # One adapter for every dataset, each example in its own template. The label
            # words differ by template (SUPPORTS / yes / True ...), so the SFT target is
            # passed as the token id itself (IdentityTargets).
            llm, prompts, targets, truncated = None, [], [], {}
            for name, task in tasks.items():
                ranker = self._ranker(cfg, name, llm=llm)
                llm = ranker.llm
                prompts += ranker.prompts(task.initial)
                targets += [ranker.tokens.id_for(x.label) for x in task.initial]
                truncated[name] = ranker.prompter.truncated
            console.print(f"  training the mixed M0 on {len(prompts)} labelled examples of {len(tasks)} datasets")
            result = train_round(llm, IdentityTargets(), "sft", prompts, targets, config, save_dir=m0_dir,
                                 checkpoint=checkpoint)
            result.truncated_passages = sum(truncated.values())
        else:
            task = tasks[ds]
            console.print(f"  training M0 on {len(task.initial)} labelled examples")
            ranker = self._ranker(cfg, ds)
            prompts = ranker.prompts(task.initial)
            result = train_round(ranker.llm, ranker.tokens, "sft", prompts, [x.label for x in task.initial], config,
                                 save_dir=m0_dir, checkpoint=checkpoint)
            truncated = result.truncated_passages = ranker.prompter.truncated
        info = {"m0": cfg.m0, "fingerprint": fingerprint, "train": result.summary(), "truncated_prompts": truncated}
        write_json(info_path, info)
        from ragsieve.artifacts import record_training_outputs

        for line in record_training_outputs(work.parent, [m0_dir / "adapter_model.safetensors"]):
            console.print(f"  [dim]{line}[/]")
        return M0(m0_dir, info)

    def _m0_eval(self, cfg, task, m0: "M0", out_dir: Path, console: Console) -> dict:
        """M0 on the test set, the SFT-set sample and D_1: once per dataset, shared by every cell."""
        path = out_dir / "cells" / task.dataset / "_m0.json"
        cache = out_dir / "work" / task.dataset / "m0_d1.json"  # M0's verdicts on D_1 (round 1's input)
        ranker = None
        if not cache.exists() or json.loads(cache.read_text()).get("m0_weights", m0.weights) != m0.weights:
            ranker = self._ranker(cfg, task.dataset, adapters=[m0.dir])
            d1 = ranker.predict(task.rounds[0])
            write_json(cache, {"m0_weights": m0.weights, "logp_true": d1.logp_true.tolist(),
                               "logp_false": d1.logp_false.tolist()}, indent=None)
        if path.exists():  # committed with the finished cells: keep it, if made with this very M0
            base = json.loads(path.read_text())
            same = base.get("m0") == cfg.m0 and base.get("m0_fingerprint", m0.info.get("fingerprint")) == m0.info.get(
                "fingerprint") and base.get("test_ids") == [x.id for x in task.test]
            if not same:
                raise RagsieveError(f"{path} was made with another M0 or test set; delete it or use another out_dir")
            if base.get("m0_weights") != m0.weights:
                base = self._adopt_record(cfg, task, m0, path, base, console, ranker)
            return {**base, "d1": json.loads(cache.read_text())}
        start = time.perf_counter()
        ranker = ranker or self._ranker(cfg, task.dataset, adapters=[m0.dir])
        base = {"dataset": task.dataset, "m0": cfg.m0, "m0_fingerprint": m0.info.get("fingerprint"),
                "m0_weights": m0.weights, "train": m0.info.get("train"), "test_ids": [x.id for x in task.test],
                "test_query_ids": [x.query_id for x in task.test], "test": score_examples(ranker, task.test)}
        samples = forgetting_samples(task, cfg.forgetting_per_split, cfg.seed)
        if samples:
            base["forgetting"] = forgetting_eval(ranker, samples, 0, {}, 0)
            base.update(forgetting_ids(samples))
        base["seconds"] = round(time.perf_counter() - start, 1)
        write_json(path, base)
        t = base["test"]
        console.print(f"  M0 on the test set: accuracy {t['accuracy']:.3f} {t['ci95']} (n={t['n']})")
        return {**base, "d1": json.loads(cache.read_text())}

    def _adopt_record(self, cfg, task, m0: "M0", path: Path, base: dict, console: Console, ranker) -> dict:
        """A committed ``_m0.json`` made with other or unrecorded M0 weights (an M0 retrained in a fresh
        clone, or a record older than ``m0_weights``): re-score M0 on the test set and keep the record
        only if every verdict comes out the same (then with the margins and weights it lacked).
        Otherwise the dataset's records were scored against another M0: stop rather than mix them in."""
        if base.get("m0_weights"):
            raise RagsieveError(
                f"{path} was scored with M0 weights {base['m0_weights']}, not {m0.dir}'s ({m0.weights}): restore "
                f"that M0 (work/ is git-ignored; artifacts.json has its sha256) or move {path.parent} aside to redo "
                "the dataset")
        ranker = ranker or self._ranker(cfg, task.dataset, adapters=[m0.dir])
        fresh = score_examples(ranker, task.test)
        differ = sum(a != b for a, b in zip(fresh["pred"], base["test"]["pred"]))
        if differ:
            raise RagsieveError(
                f"{path} was scored with another M0 ({differ} of {len(task.test)} test verdicts differ from "
                f"{m0.dir}'s; a retrained M0 is not bitwise the same): move {path.parent} aside to redo the dataset")
        base["test"].update(auroc=fresh["auroc"], margins=fresh["margins"])
        base["test_query_ids"] = [x.query_id for x in task.test]
        base["m0_weights"] = m0.weights
        write_json(path, base)
        console.print(f"  {path.name}: M0's test verdicts re-scored the same; its weights recorded")
        return base

    def _judges(self, cfg, task, console: Console):
        from ragsieve.evolve.judges import build_judges

        judges = build_judges(cfg.judges, task.dataset)
        for judge in judges:
            judge.calibrate(task.initial)  # the labelled SFT set: the only labels CautiousDPO may use
        console.print("  judges: " + ", ".join(f"{j.name} (threshold {j.threshold})" for j in judges))
        return judges

    @staticmethod
    def _partial_dirs(out_dir: Path, cell: Cell) -> tuple[Path, Path]:
        """(per-round JSONs, small and committable; per-round adapters, under the ignored work/)."""
        return out_dir / "cells" / cell.dataset / cell.name, out_dir / "work" / cell.dataset / cell.name

    @staticmethod
    def _m0_fingerprint(cfg, tasks: dict) -> str:
        """What M0 depends on: a reused adapter must come from the same SFT set(s) and settings."""
        import hashlib

        recipe = cfg.m0_train if cfg.m0 == "mixed" else cfg.m0_train_for(next(iter(tasks)))
        key = {"m0": cfg.m0, "m0_train": recipe.model_dump(), "llm": cfg.llm, "seed": cfg.seed,
               "max_prompt_tokens": cfg.max_prompt_tokens,
               "initial": {ds: [x.id for x in t.initial] for ds, t in tasks.items()}}
        return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    @staticmethod
    def _fingerprint(cfg, cell: Cell, task) -> str:
        """What a finished round depends on; a partial round made under other settings is redone."""
        import hashlib

        key = {
            "method": cell.method.model_dump(), "train": cfg.train.model_dump(),
            "m0_train": cfg.m0_train_for(cell.dataset).model_dump(),
            "m0": cfg.m0, "llm": cfg.llm, "seed": cfg.seed, "max_prompt_tokens": cfg.max_prompt_tokens,
            "splits": [[x.id for x in split] for split in task.splits()], "test": [x.id for x in task.test],
            "judges": [j.model_dump() for j in cfg.judges] if cell.method.kind == "cautious-dpo" else [],
        }
        return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    def _check_finished(self, cfg, cells: list[Cell], task, out_dir: Path) -> None:
        """A finished cell is skipped, so it must have been made under these settings (stage 1 → full
        matrix share an out_dir on purpose; a changed size or lr must not silently mix in)."""
        for cell in cells:
            path = self._cell_path(out_dir, cell)
            if path.exists():
                made = json.loads(path.read_text()).get("fingerprint")  # the small study's cells have none
                if made and made != self._fingerprint(cfg, cell, task):
                    raise RagsieveError(f"{path} was made under other settings; delete it or use another out_dir")

    def _check_same_m0(self, finished: list[Cell], m0: "M0", out_dir: Path) -> None:
        """New cells are compared with the finished ones example by example: all must start from one M0."""
        for cell in finished:
            path = self._cell_path(out_dir, cell)
            made = json.loads(path.read_text()).get("m0_weights")  # None: older than the field, see _adopt_record
            if made and made != m0.weights:
                raise RagsieveError(f"{path} started from M0 weights {made}, not {m0.dir}'s ({m0.weights}): "
                                    f"restore that M0 or move {path.parent} aside to redo the dataset")

    def _finished_rounds(self, out_dir: Path, cell: Cell, fingerprint: str, rounds: int) -> list[dict]:
        """The longest prefix of rounds with a matching record and (if it trained) its adapter."""
        part, adapters = self._partial_dirs(out_dir, cell)
        done = []
        for t in range(1, rounds + 1):
            path = part / f"round-{t}.json"
            if not path.exists():
                break
            row = json.loads(path.read_text())
            if row.get("fingerprint") != fingerprint:
                break
            if row.get("trained") and not (adapters / f"round-{t}" / "adapter_config.json").exists():
                break  # e.g. a clone without work/: M_t cannot be rebuilt, so redo from here
            done.append(row)
        return done

    def _drop_partial(self, cfg, out_dir: Path, cell: Cell) -> None:
        """The finished cell JSON holds every round: drop the per-round files (and the adapters)."""
        import shutil

        part, adapters = self._partial_dirs(out_dir, cell)
        shutil.rmtree(part, ignore_errors=True)
        if not cfg.keep_adapters:
            shutil.rmtree(adapters, ignore_errors=True)

    def _run_cell(self, cfg, cell: Cell, task, m0: "M0", base: dict | None, judges, out_dir: Path,
                  console: Console) -> dict:
        """The rounds of one cell, resuming after the last checkpointed round (see the module doc)."""
        from ragsieve.evolve.methods import Pair, build_method, evolve_round
        from ragsieve.models.verdict import VerdictScores

        import numpy as np

        method = build_method(cell.method, judges)
        fingerprint = self._fingerprint(cfg, cell, task)
        part, adapter_dir = self._partial_dirs(out_dir, cell)
        done = self._finished_rounds(out_dir, cell, fingerprint, len(task.rounds))
        adapters = [m0.dir] + [adapter_dir / f"round-{r['round']}" for r in done if r["trained"]]
        ranker = self._ranker(cfg, cell.dataset, adapters=adapters)
        by_id = {x.id: x for split in task.splits() for x in split}
        history = [Pair(x, x.label, "gold", 0) for x in task.initial]
        for r in done:
            history += [Pair(by_id[i], lab, src, r["round"]) for i, lab, src in r["pairs"]]
        if done:
            console.print(f"  {cell.dataset} / {cell.name}: resuming after round {len(done)} (M_t from adapters)")
        train_last = cfg.train_last_round
        if train_last == "auto":  # M_R is scored on the test set, or ranks the downstream QA
            train_last = bool(cfg.test_size) or self._downstream(cfg, cell.dataset)
        samples = forgetting_samples(task, cfg.forgetting_per_split, cfg.seed)
        version, cache = sum(bool(r["trained"]) for r in done), {}
        last_test = (done[-1].get("test") if done else None) or (base["test"] if base else None)
        rounds = list(done)
        for t in range(len(done) + 1, len(task.rounds) + 1):
            batch = task.rounds[t - 1]
            visible = {x.id: x.label for x in batch} if method.uses_gold else {}
            known = None
            if t == 1 and base and "d1" in base:  # M0 on D_1: the same for every cell, computed once
                known = VerdictScores(np.array(base["d1"]["logp_true"]), np.array(base["d1"]["logp_false"]))
            record, new_pairs = evolve_round(
                ranker, method, batch, history, round_id=t, labels=visible, train_config=cfg.train,
                train=t < len(task.rounds) or bool(train_last), seed=cfg.seed, save_dir=adapter_dir / f"round-{t}",
                verdicts=known,
            )
            trained = bool(record.train.get("steps"))
            version += trained
            row = {**record.to_json(), "trained": trained, "fingerprint": fingerprint,
                   "pairs": [[p.example.id, p.label, p.source] for p in new_pairs]}
            if cfg.test_size:
                start = time.perf_counter()
                if trained or last_test is None:  # an untouched model keeps its test outcomes
                    last_test = score_examples(ranker, task.test)
                row["test"] = last_test
                if samples:
                    row["forgetting"] = forgetting_eval(ranker, samples, t, cache, version)
                row["seconds"]["test"] = round(time.perf_counter() - start, 2)
            write_json(part / f"round-{t}.json", row)  # after the adapter: a kill before this redoes round t
            history += new_pairs
            rounds.append(row)
            test_note = f", test {row['test']['accuracy']:.3f}" if "test" in row else ""
            console.print(
                f"  {cell.dataset} / {cell.name} round {t}: accuracy {record.metrics['accuracy']:.3f} "
                f"f1 {record.metrics['f1']:.3f}{test_note}, {record.n_new_pairs}+{record.n_replayed} pairs, "
                f"{record.seconds['total'] + row['seconds'].get('test', 0):.0f}s"
            )
        result: dict[str, Any] = {
            "dataset": cell.dataset, "cell": cell.name, "method": cell.method.model_dump(), "rounds": rounds,
            "fingerprint": fingerprint, "m0_weights": m0.weights,
            "seconds": round(sum(r["seconds"]["total"] + r["seconds"].get("test", 0) for r in rounds), 1),
        }
        if cfg.test_size:
            result["test_ids"] = [x.id for x in task.test]
        if samples:
            result.update(forgetting_ids(samples))
        if self._downstream(cfg, cell.dataset, cell.name):
            result["downstream"] = self._downstream_qa(cfg, task, console, ranker=ranker)
        return result

    # -- downstream QA on held-out HotpotQA questions ----------------------------------
    def _held_out(self, cfg, task):
        from ragsieve.data.records import Passage
        from ragsieve.evolve.tasks import hotpot_questions

        keep = set(task.held_out_query_ids)
        sentences: dict[str, list[tuple[Passage, int]]] = {}
        if getattr(self, "_hotpot", None) is None:  # parsed once per run: every HotpotQA cell asks
            self._hotpot = hotpot_questions(cfg.data_dir, cfg.hotpot_source)["questions"]
        every = self._hotpot
        questions = {q: every[q] for q in keep if q in every}
        for p in task.held_out:  # the held-out questions' sentence pairs, as the task cut them
            if p.query_id in keep and p.passage.strip():
                paragraph = int(p.id.split(":")[-2])
                title = questions[p.query_id].meta["candidate_ids"][paragraph]
                sentences.setdefault(p.query_id, []).append((Passage(p.id, p.passage, title), p.label))
        return [questions[q] for q in task.held_out_query_ids if q in questions], sentences

    def _answer(self, cfg, questions, contexts) -> dict:
        from ragsieve.eval.qa import qa_metrics
        from ragsieve.models.llm import load_local_llm
        from ragsieve.prompts import first_line
        from ragsieve.prompts import load_qa_prompts
        from ragsieve.prompts.builder import PromptBuilder

        d = cfg.downstream
        if self._generator is None:
            self._generator = load_local_llm(d.generator)
        builder = PromptBuilder(self._generator, load_qa_prompts(), d.max_prompt_tokens)
        built = [builder.with_context(q.text, c) for q, c in zip(questions, contexts)]
        texts = self._generator.generate(
            [b.text for b in built], system=builder.prompts.system, max_new_tokens=d.max_new_tokens,
            batch_size=d.batch_size,
        )
        answers = [first_line(t) for t in texts]
        out = qa_metrics(answers, [q.answers for q in questions])
        out["answers"] = {q.id: a for q, a in zip(questions, answers)}
        out.update(per_question_scores(answers, [q.answers for q in questions], [q.id for q in questions]))
        return out

    def _downstream_qa(self, cfg, task, console: Console, ranker) -> dict:
        questions, sentences = self._held_out(cfg, task)
        k = cfg.downstream.top_k
        contexts, recall = [], []
        for q in questions:
            cands = sentences.get(q.id, [])
            top = ranker.rank(q.text, [p for p, _ in cands]).top_k(k) if cands else []
            contexts.append([r.passage for r in top])
            gold = sum(lab for _, lab in cands)
            recall.append(sum(cands[r.index][1] for r in top) / gold if gold else 0.0)
        out = self._answer(cfg, questions, contexts)
        out.update(top_k=k, support_recall=sum(recall) / max(len(recall), 1))
        out["per_question"]["support_recall"] = [round(r, 4) for r in recall]
        console.print(f"  downstream QA: EM {out['em']:.3f} F1 {out['f1']:.3f} support recall@{k} {out['support_recall']:.3f}")
        return out

    def _baselines(self, cfg, task, console: Console) -> dict:
        """Reference points for the downstream QA: the gold supporting sentences, and none."""
        questions, sentences = self._held_out(cfg, task)
        gold = [[p for p, lab in sentences.get(q.id, []) if lab] for q in questions]
        out = {"gold-support": self._answer(cfg, questions, gold), "closed-book": self._answer(cfg, questions, [[]] * len(questions))}
        if cfg.downstream.base_reranker:
            from ragsieve.registry import load_reranker

            base = load_reranker(cfg.downstream.base_reranker)
            out["base-reranker"] = self._downstream_qa(cfg, task, console, ranker=base)
        for name, m in out.items():
            console.print(f"  downstream {name}: EM {m['em']:.3f} F1 {m['f1']:.3f}")
        return out

    # -- aggregation --------------------------------------------------------------
    def _aggregate(self, cfg, cells, out_dir: Path, sizes, m0_info, sample_queries: dict | None = None) -> dict:
        from ragsieve.eval.classification import accuracy_interval
        from studies import evolve_stats as st

        def curve(result: dict) -> list[dict]:
            # The 95 % interval says which round-to-round and method differences are noise.
            return [
                {"round": r["round"], "accuracy": r["accuracy"], "f1": r["f1"], "n": r["n"],
                 "accuracy_ci95": [round(x, 4) for x in accuracy_interval(round(r["accuracy"] * r["n"]), r["n"])]
                 if r["n"] else None,  # a round without known labels has no accuracy
                 "positive_rate": r.get("positive_rate")}
                for r in result["rounds"]
            ]

        results = {}
        for cell in cells:
            path = self._cell_path(out_dir, cell)
            if path.exists():
                results[(cell.dataset, cell.name)] = json.loads(path.read_text())
        base = {}
        for ds in cfg.datasets:
            path = out_dir / "cells" / ds / "_m0.json"
            if cfg.test_size and path.exists():
                base[ds] = json.loads(path.read_text())
        # At scale every curve is M_t on the fixed test set (t = 0 is M0); otherwise M_{t-1} on D_t.
        shown = (lambda ds, res: st.test_curve(res, base[ds])) if cfg.test_size else (lambda ds, res: curve(res))

        def curves(ds: str, named: list[tuple[str, str]]) -> dict:
            return {label: shown(ds, results[(ds, cell)]) for label, cell in named
                    if (ds, cell) in results and (not cfg.test_size or ds in base)}

        by_dataset = {ds: {m: curve(results[(ds, m)]) for m in cfg.methods if (ds, m) in results}
                      for ds in cfg.datasets}
        sweeps = {name: {ds: curves(ds, named) for ds, named in by_ds.items()}
                  for name, by_ds in sweep_cells(cfg).items()}
        pseudo, pseudo_labels = {}, {}
        for (ds, name), result in results.items():
            if result["method"]["kind"] == "cautious-dpo":
                pseudo.setdefault(ds, {})[name] = [{"round": r["round"], **r["labels"]} for r in result["rounds"]]
                pseudo_labels.setdefault(ds, {})[name] = st.pseudo_label_rows(result)
        downstream = {}
        for (ds, name), result in results.items():
            if "downstream" in result:
                downstream[name] = {k: v for k, v in result["downstream"].items() if k not in BULKY}
        base_path = out_dir / "cells" / DOWNSTREAM_DATASET / "_baselines.json"
        if base_path.exists():
            for name, m in json.loads(base_path.read_text()).items():
                downstream[name] = {k: v for k, v in m.items() if k not in BULKY}
        steps = [
            (r["train"]["seconds"], r["train"]["steps"])
            for (ds, name), res in results.items() if res["method"]["kind"] in ("dpo", "replay-dpo", "cautious-dpo")
            for r in res["rounds"] if r.get("train", {}).get("steps")
        ]
        metrics = {
            "by_dataset": by_dataset,
            **sweeps,  # alpha_sweep, tau_sweep, ablation
            "pseudo_label_accuracy": pseudo,
            "pseudo_labels": pseudo_labels,
            "downstream": downstream,
            "targets": targets(by_dataset),
            "m0": m0_info,
            "sizes": sizes,
            "seconds": {
                "cells": {f"{ds}/{name}": r["seconds"] for (ds, name), r in results.items()},
                "dpo_seconds_per_step": round(sum(s for s, _ in steps) / sum(n for _, n in steps), 2) if steps else None,
            },
            "config": cfg.model_dump(),
        }
        if cfg.test_size:
            metrics.update(self._scale_metrics(cfg, results, base, sample_queries or {}))
            metrics["collapse"] = st.collapse_summary(pseudo_labels, metrics["test_curves"], metrics["paired"])
        per_question = {name: r["downstream"]["per_question"] for (ds, name), r in results.items()
                        if "per_question" in r.get("downstream", {})}
        if base_path.exists():
            per_question.update({name: m["per_question"] for name, m in json.loads(base_path.read_text()).items()
                                 if "per_question" in m})
        if per_question:
            metrics["downstream_stats"] = downstream_stats(per_question)
        return metrics

    @staticmethod
    def _scale_metrics(cfg, results: dict, base: dict, sample_queries: dict) -> dict:
        """Test-set curves, forgetting, M0 vs chance, paired McNemar tests and the issue's targets."""
        from studies import evolve_stats as st

        test_curves = {ds: {m: st.test_curve(results[(ds, m)], base[ds]) for m in cfg.methods if (ds, m) in results}
                       for ds in base}
        forgetting = {ds: {m: st.forgetting_curve(results[(ds, m)], base[ds], sample_queries.get(ds))
                           for m in cfg.methods if (ds, m) in results}
                      for ds in base}
        m0_stats = {ds: st.m0_vs_chance(b) for ds, b in base.items()}
        def family(ds: str, pairs) -> dict:
            """Exact McNemar for each (label, cell, reference) that finished, Holm-adjusted as one family."""
            tests = {f"{label} vs {ref}": st.paired_last_round(results[(ds, cell)], results[(ds, ref)], base[ds])
                     for label, cell, ref in pairs if cell != ref and (ds, cell) in results and (ds, ref) in results}
            st.add_holm(tests)
            return tests

        paired = {ds: tests for ds in base if (tests := family(ds, [(a, a, b) for a, b in PAIRED_TESTS]))}
        sweep_paired: dict[str, dict] = {}
        for name, by_ds in sweep_cells(cfg).items():
            for ds, named in by_ds.items():
                # one family per sweep and dataset
                pairs = [(label, cell, ref) for ref in SWEEP_REFERENCES[name] for label, cell in named]
                if ds in base and (tests := family(ds, pairs)):
                    sweep_paired.setdefault(name, {})[ds] = tests
        out = {
            "test_curves": test_curves, "forgetting": forgetting, "m0_test": m0_stats, "paired": paired,
            "sweep_paired": sweep_paired, "scale_targets": st.scale_targets(m0_stats, paired),
        }
        if cfg.compare_m0_to:
            other_dir = Path(cfg.compare_m0_to) / "cells"
            other = {ds: json.loads((other_dir / ds / "_m0.json").read_text()) for ds in base
                     if (other_dir / ds / "_m0.json").is_file()}
            out["m0_vs_other"] = {"other": cfg.compare_m0_to,
                                  **{ds: st.paired_m0(base[ds], other[ds]) for ds in other}}
        return out

    def _print(self, metrics: dict, console: Console) -> None:
        scale = "test_curves" in metrics
        shown = metrics["test_curves"] if scale else metrics["by_dataset"]
        title = "test accuracy of M_R (last round)" if scale else "accuracy of M_{t-1} on round t (last round)"
        table = Table(title=title)
        methods = sorted({m for d in shown.values() for m in d}, key=lambda m: (m not in MAIN_METHODS, m))
        table.add_column("dataset")
        if scale:
            table.add_column("M0")
        for m in methods:
            table.add_column(m)
        for ds, by_method in shown.items():
            m0 = [] if not scale else [f"{metrics['m0_test'][ds]['accuracy']:.3f}" if ds in metrics["m0_test"] else "-"]
            table.add_row(ds, *m0, *[f"{by_method[m][-1]['accuracy']:.3f}" if m in by_method else "-" for m in methods])
        console.print(table)
        for ds, tests in metrics.get("paired", {}).items():
            for name, r in tests.items():
                if r:
                    console.print(f"  {ds}: {name}: {r['a']:.3f} vs {r['b']:.3f}, {r['a_only']}/{r['b_only']} right "
                                  f"alone, {r.get('test', 'exact McNemar')} p={r['p_value']:.3g} ({r['verdict']})")


QA_METRICS = ("em", "f1", "containment")
# What the reranker itself achieves: the share of a question's supporting sentences in its top k
# (not defined for the fixed contexts: gold support, closed book).
RANKING_METRICS = ("support_recall",)
BULKY = ("answers", "per_question")  # kept in the cell JSONs, left out of metrics.json


def per_question_scores(answers, golds, ids) -> dict[str, Any]:
    """EM / F1 / containment per question, kept so methods compare paired on the same questions."""
    from ragsieve.eval.qa import contains_answer, exact_match, token_f1

    return {"per_question": {
        "ids": list(ids),
        "em": [int(exact_match(a, g)) for a, g in zip(answers, golds)],
        "f1": [round(token_f1(a, g), 4) for a, g in zip(answers, golds)],
        "containment": [int(contains_answer(a, g)) for a, g in zip(answers, golds)],
    }}


def downstream_stats(per_question: dict[str, dict]) -> dict[str, Any]:
    """Bootstrap intervals of EM / F1 / containment (and, for rerankers, support recall@k) per
    context source, and paired differences of every source against the base reranker (else the
    frozen M0, ``sft-only``)."""
    from ragsieve.eval.stats import bootstrap_ci, paired_bootstrap

    def metrics_of(pq: dict) -> list[str]:
        return [m for m in QA_METRICS + RANKING_METRICS if m in pq]

    out: dict[str, Any] = {"intervals": {}, "vs": None, "paired": {}}
    for name, pq in per_question.items():
        out["intervals"][name] = {
            m: dict(zip(("mean", "low", "high"), (round(x, 4) for x in bootstrap_ci(pq[m])))) for m in metrics_of(pq)
        } | {"n": len(pq["ids"])}
    ref = next((r for r in ("base-reranker", "sft-only") if r in per_question), None)
    if ref is None:
        return out
    out["vs"] = ref
    for name, pq in per_question.items():
        if name == ref or pq["ids"] != per_question[ref]["ids"]:
            continue
        out["paired"][name] = {m: paired_bootstrap(pq[m], per_question[ref][m]).to_dict()
                               for m in metrics_of(pq) if m in per_question[ref]}
    return out


def targets(by_dataset: dict) -> dict:
    """The issue's targets: ReplayDPO >= DPO on the last round everywhere; CautiousDPO > SFT-only on >= 4 of 6."""
    def last(ds: str, m: str):
        curve = by_dataset.get(ds, {}).get(m)
        return curve[-1]["accuracy"] if curve else None

    replay, cautious = {}, {}
    for ds in by_dataset:
        r, d = last(ds, "replay-dpo"), last(ds, "dpo")
        if r is not None and d is not None:
            replay[ds] = {"replay-dpo": r, "dpo": d, "difference": round(r - d, 4), "met": r >= d}
        c, s = last(ds, "cautious-dpo"), last(ds, "sft-only")
        if c is not None and s is not None:
            cautious[ds] = {"cautious-dpo": c, "sft-only": s, "difference": round(c - s, 4), "met": c > s}
    wins = sum(v["met"] for v in cautious.values())
    return {
        "replay_ge_dpo_last_round": {"per_dataset": replay, "met": bool(replay) and all(v["met"] for v in replay.values())},
        "cautious_gt_sft_only": {"per_dataset": cautious, "wins": wins, "met": wins >= 4},
    }


def plot_accuracy_by_round(by_method: dict, path: Path, title: str) -> Path | None:
    """Accuracy of M_{t-1} on D_t by round, one line per method (Agg canvas, no pyplot)."""
    if not by_method:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.6), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for method, curve in by_method.items():
        xs, ys = [r["round"] for r in curve], [r["accuracy"] for r in curve]
        ci = [r.get("ci95") for r in curve]
        if all(ci):  # test-set curves carry Wilson intervals: draw them
            err = [[y - c[0] for y, c in zip(ys, ci)], [c[1] - y for y, c in zip(ys, ci)]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=2, label=method)
        else:
            ax.plot(xs, ys, marker="o", label=method)
    # One grey band: the 95 % interval of a chance-level accuracy at this round size,
    # i.e. how far apart two methods must be before the gap means anything.
    n = min(r["n"] for c in by_method.values() for r in c)
    if n > 0:
        from ragsieve.eval.classification import accuracy_interval

        lo, hi = accuracy_interval(n // 2, n)
        ax.axhspan(lo, hi, color="grey", alpha=0.15, label=f"95 % CI of 50 % at n={n}")
    ax.set_xlabel("round t (M_t on the test set)" if any("ci95" in r for c in by_method.values() for r in c)
                  else "round t (M_{t-1} evaluated on D_t)")
    ax.set_ylabel("accuracy")
    ax.set_xticks(sorted({r["round"] for c in by_method.values() for r in c}))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
