"""`ragsieve run experiments/evolve.yaml`: every method over four rounds on six datasets.

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
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

from rich.console import Console
from rich.table import Table

from ragsieve.config import StrictConfig
from ragsieve.evolve.judges import JudgeSpec
from ragsieve.evolve.methods import MethodConfig
from ragsieve.evolve.train import VerdictTrainConfig
from ragsieve.models.specs import DEFAULT_LLM
from ragsieve.studies.common import write_json

DOWNSTREAM_DATASET = "hotpotqa-distractor"
MAIN_METHODS = ("sft-only", "sft", "dpo", "replay-dpo", "cautious-dpo")
# CautiousDPO variants run on `ablation_datasets`: two ablations and the collapse guard.
ABLATIONS = {"no-gating": {"gating": False}, "no-jury": {"jury": False}, "balanced": {"balance": True}}


class RoundSizes(StrictConfig):
    initial: int = 128  # labelled SFT set → M0
    per_round: int = 64  # D_t, t = 1..rounds


class DownstreamConfig(StrictConfig):
    enabled: bool = True
    held_out_questions: int = 20  # HotpotQA questions kept out of every round
    top_k: int = 3
    generator: str = DEFAULT_LLM
    max_new_tokens: int = 16
    max_prompt_tokens: int = 1024
    batch_size: int = 8


class EvolveExperimentConfig(StrictConfig):
    llm: str = DEFAULT_LLM
    datasets: list[str] = ["anli", "fever", "hotpotqa-distractor", "multirc", "pubmedqa", "bioasq"]
    methods: list[str] = list(MAIN_METHODS)
    rounds: int = 4
    sizes: RoundSizes = RoundSizes()
    size_overrides: dict[str, RoundSizes] = {}
    balanced: bool = True
    max_prompt_tokens: int = 320
    eval_batch_size: int = 8
    m0_train: VerdictTrainConfig = VerdictTrainConfig(lr=2e-4, epochs=2)
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
    ablation_datasets: list[str] = []
    # "auto": train M_R (after the last evaluation) only where the downstream QA uses it.
    train_last_round: Union[bool, Literal["auto"]] = "auto"
    downstream: DownstreamConfig = DownstreamConfig()
    # torch CPU threads (0 = torch's default). On a 2-core machine shared with other jobs,
    # 1 thread ran a SmolLM2 step 2.7x faster than 2 oversubscribed ones (17 s vs 47 s).
    threads: int = 0
    seed: int = 0
    data_dir: Union[str, None] = None

    def sizes_for(self, dataset: str) -> RoundSizes:
        return self.size_overrides.get(dataset, self.sizes)


@dataclass(frozen=True)
class Cell:
    dataset: str
    name: str  # file stem: "dpo", "replay-dpo@0.5", "cautious-dpo:no-gating"
    method: MethodConfig


def plan_cells(cfg: EvolveExperimentConfig) -> list[Cell]:
    """Every (dataset, method) cell of the matrix, each once, in run order."""
    from ragsieve.evolve.methods import METHODS
    from ragsieve.errors import RagsieveError

    unknown = [m for m in cfg.methods if m not in METHODS]
    if unknown:
        raise RagsieveError(f"unknown method(s) {unknown}; known: {', '.join(METHODS)}")

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
        if ds in cfg.ablation_datasets:
            cells.setdefault((ds, "cautious-dpo"), Cell(ds, "cautious-dpo", main("cautious-dpo")))
            for variant, change in ABLATIONS.items():
                name = f"cautious-dpo:{variant}"
                cells[(ds, name)] = Cell(ds, name, main("cautious-dpo").model_copy(update=change))
    return list(cells.values())


def _alpha_cell(cfg: EvolveExperimentConfig, alpha: float) -> str:
    if alpha >= 1.0:
        return "dpo"
    if abs(alpha - cfg.alpha) < 1e-9:
        return "replay-dpo"
    return f"replay-dpo@{alpha:g}"


class EvolveExperiment:
    """The experiment behind ``experiment: evolve``.

    Example::

        cfg = EvolveExperimentConfig(datasets=["bioasq"], methods=["sft-only", "dpo"])
        EvolveExperiment().run(cfg, Path("results/evolve"), Console())
    """

    Config = EvolveExperimentConfig

    def run(self, cfg: EvolveExperimentConfig, out_dir: Path, console: Console) -> dict:
        from ragsieve.evolve.tasks import build_task_rounds

        t0 = time.perf_counter()
        if cfg.threads:
            import torch

            torch.set_num_threads(cfg.threads)
        work = out_dir / "work"
        work.mkdir(parents=True, exist_ok=True)
        (work / ".gitignore").write_text("*\n")  # adapters are large and rebuilt on demand
        cells = plan_cells(cfg)
        sizes: dict[str, Any] = {}
        m0_info: dict[str, Any] = {}
        self._generator = None
        for ds in cfg.datasets:
            size = cfg.sizes_for(ds)
            held_out = cfg.downstream.held_out_questions if self._downstream(cfg, ds) else 0
            task = build_task_rounds(
                ds, initial_size=size.initial, round_size=size.per_round, rounds=cfg.rounds, seed=cfg.seed,
                balanced=cfg.balanced, held_out_queries=held_out, data_dir=cfg.data_dir,
            )
            sizes[ds] = {**task.sizes(), "split": task.meta["split"], "held_out_questions": len(task.held_out_query_ids)}
            pending = [c for c in cells if c.dataset == ds and not self._cell_path(out_dir, c).exists()]
            console.print(f"[bold]{ds}[/]: {len(pending)} cell(s) to run, sizes {task.sizes()}")
            judges = None
            for cell in pending:
                m0_dir, m0_info[ds] = self._ensure_m0(cfg, task, work, console)
                if cell.method.kind == "cautious-dpo" and judges is None:
                    judges = self._judges(cfg, task, console)
                result = self._run_cell(cfg, cell, task, m0_dir, judges or [], console)
                write_json(self._cell_path(out_dir, cell), result)
            if ds not in m0_info and (work / ds / "m0.json").exists():
                m0_info[ds] = json.loads((work / ds / "m0.json").read_text())
            if self._downstream(cfg, ds) and not (out_dir / "cells" / ds / "_baselines.json").exists():
                write_json(out_dir / "cells" / ds / "_baselines.json", self._baselines(cfg, task, console))
        metrics = self._aggregate(cfg, cells, out_dir, sizes, m0_info)
        metrics["seconds"]["this_run"] = round(time.perf_counter() - t0, 1)
        write_json(out_dir / "metrics.json", metrics)
        for ds in cfg.datasets:
            plot_accuracy_by_round(metrics["by_dataset"].get(ds, {}), out_dir / f"accuracy_{ds}.png", ds)
        for ds, curves in metrics["alpha_sweep"].items():
            plot_accuracy_by_round({f"α = {a}": c for a, c in curves.items()}, out_dir / f"alpha_sweep_{ds}.png",
                                   f"{ds}: ReplayDPO, share α of new pairs")
        for ds, curves in metrics["ablation"].items():
            plot_accuracy_by_round(curves, out_dir / f"ablation_{ds}.png", f"{ds}: CautiousDPO variants")
        self._print(metrics, console)
        console.print(f"wrote {out_dir / 'metrics.json'} in {metrics['seconds']['this_run']:.0f}s")
        return metrics

    # -- pieces -------------------------------------------------------------------
    @staticmethod
    def _downstream(cfg: EvolveExperimentConfig, ds: str) -> bool:
        return cfg.downstream.enabled and ds == DOWNSTREAM_DATASET

    @staticmethod
    def _cell_path(out_dir: Path, cell: Cell) -> Path:
        return out_dir / "cells" / cell.dataset / f"{cell.name}.json"

    def _ranker(self, cfg: EvolveExperimentConfig, ds: str, adapters=()):
        from ragsieve.rerank.pointwise import PointwiseLLMReranker

        return PointwiseLLMReranker(
            ds, cfg.llm, adapters=adapters, max_prompt_tokens=cfg.max_prompt_tokens, batch_size=cfg.eval_batch_size
        )

    def _ensure_m0(self, cfg, task, work: Path, console: Console) -> tuple[Path, dict]:
        """M0 = SFT on the labelled set, trained once per dataset (atomic adapter folder)."""
        from ragsieve.evolve.train import train_round

        m0_dir, info_path = work / task.dataset / "m0", work / task.dataset / "m0.json"
        if info_path.exists() and (m0_dir / "adapter_config.json").exists():
            return m0_dir, json.loads(info_path.read_text())
        console.print(f"  training M0 on {len(task.initial)} labelled examples")
        ranker = self._ranker(cfg, task.dataset)
        prompts = ranker.prompts(task.initial)
        result = train_round(
            ranker.llm, ranker.tokens, "sft", prompts, [x.label for x in task.initial],
            cfg.m0_train.model_copy(update={"seed": cfg.seed}), save_dir=m0_dir,
        )
        info = {"train": result.summary(), "truncated_prompts": ranker.prompter.truncated}
        write_json(info_path, info)
        return m0_dir, info

    def _judges(self, cfg, task, console: Console):
        from ragsieve.evolve.judges import build_judges

        judges = build_judges(cfg.judges, task.dataset)
        for judge in judges:
            judge.calibrate(task.initial)  # the labelled SFT set: the only labels CautiousDPO may use
        console.print("  judges: " + ", ".join(f"{j.name} (threshold {j.threshold})" for j in judges))
        return judges

    def _run_cell(self, cfg, cell: Cell, task, m0_dir: Path, judges, console: Console) -> dict:
        from ragsieve.evolve.methods import Pair, build_method, evolve_round

        start = time.perf_counter()
        method = build_method(cell.method, judges)
        ranker = self._ranker(cfg, cell.dataset, adapters=[m0_dir])
        history = [Pair(x, x.label, "gold", 0) for x in task.initial]
        train_last = cfg.train_last_round if cfg.train_last_round != "auto" else self._downstream(cfg, cell.dataset)
        rounds = []
        for t, batch in enumerate(task.rounds, start=1):
            visible = {x.id: x.label for x in batch} if method.uses_gold else {}
            record, new_pairs = evolve_round(
                ranker, method, batch, history, round_id=t, labels=visible, train_config=cfg.train,
                train=t < len(task.rounds) or bool(train_last), seed=cfg.seed,
            )
            history += new_pairs
            rounds.append(record.to_json())
            console.print(
                f"  {cell.dataset} / {cell.name} round {t}: accuracy {record.metrics['accuracy']:.3f} "
                f"f1 {record.metrics['f1']:.3f}, {record.n_new_pairs}+{record.n_replayed} pairs, "
                f"{record.seconds['total']:.0f}s"
            )
        result: dict[str, Any] = {
            "dataset": cell.dataset, "cell": cell.name, "method": cell.method.model_dump(), "rounds": rounds,
            "seconds": round(time.perf_counter() - start, 1),
        }
        if self._downstream(cfg, cell.dataset):
            result["downstream"] = self._downstream_qa(cfg, task, console, ranker=ranker)
        return result

    # -- downstream QA on held-out HotpotQA questions ----------------------------------
    def _held_out(self, cfg, task):
        from ragsieve.data import load_dataset
        from ragsieve.data.records import Passage

        ds = load_dataset(DOWNSTREAM_DATASET, data_dir=cfg.data_dir)
        keep = set(task.held_out_query_ids)
        sentences: dict[str, list[tuple[Passage, int]]] = {}
        questions = {q.id: q for q in ds.questions if q.id in keep}
        for p in ds.pairs:
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
        console.print(f"  downstream QA: EM {out['em']:.3f} F1 {out['f1']:.3f} support recall@{k} {out['support_recall']:.3f}")
        return out

    def _baselines(self, cfg, task, console: Console) -> dict:
        """Reference points for the downstream QA: the gold supporting sentences, and none."""
        questions, sentences = self._held_out(cfg, task)
        gold = [[p for p, lab in sentences.get(q.id, []) if lab] for q in questions]
        out = {"gold-support": self._answer(cfg, questions, gold), "closed-book": self._answer(cfg, questions, [[]] * len(questions))}
        for name, m in out.items():
            console.print(f"  downstream {name}: EM {m['em']:.3f} F1 {m['f1']:.3f}")
        return out

    # -- aggregation --------------------------------------------------------------
    def _aggregate(self, cfg, cells, out_dir: Path, sizes, m0_info) -> dict:
        from ragsieve.eval.classification import accuracy_interval

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
        by_dataset = {
            ds: {m: curve(results[(ds, m)]) for m in cfg.methods if (ds, m) in results} for ds in cfg.datasets
        }
        alpha_sweep = {
            ds: {
                f"{a:g}": curve(results[(ds, _alpha_cell(cfg, a))])
                for a in cfg.alpha_sweep if (ds, _alpha_cell(cfg, a)) in results
            }
            for ds in cfg.alpha_sweep_datasets
        }
        ablation = {
            ds: {
                name: curve(results[(ds, cell)])
                for name, cell in [("cautious-dpo", "cautious-dpo")] + [(v, f"cautious-dpo:{v}") for v in ABLATIONS]
                if (ds, cell) in results
            }
            for ds in cfg.ablation_datasets
        }
        pseudo = {}
        for (ds, name), result in results.items():
            if result["method"]["kind"] == "cautious-dpo":
                pseudo.setdefault(ds, {})[name] = [{"round": r["round"], **r["labels"]} for r in result["rounds"]]
        downstream = {}
        for (ds, name), result in results.items():
            if "downstream" in result:
                downstream[name] = {k: v for k, v in result["downstream"].items() if k != "answers"}
        base_path = out_dir / "cells" / DOWNSTREAM_DATASET / "_baselines.json"
        if base_path.exists():
            for name, m in json.loads(base_path.read_text()).items():
                downstream[name] = {k: v for k, v in m.items() if k != "answers"}
        steps = [
            (r["train"]["seconds"], r["train"]["steps"])
            for (ds, name), res in results.items() if res["method"]["kind"] in ("dpo", "replay-dpo", "cautious-dpo")
            for r in res["rounds"] if r.get("train", {}).get("steps")
        ]
        return {
            "by_dataset": by_dataset,
            "alpha_sweep": alpha_sweep,
            "ablation": ablation,
            "pseudo_label_accuracy": pseudo,
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

    def _print(self, metrics: dict, console: Console) -> None:
        table = Table(title="accuracy of M_{t-1} on round t (last round)")
        methods = sorted({m for d in metrics["by_dataset"].values() for m in d}, key=lambda m: (m not in MAIN_METHODS, m))
        table.add_column("dataset")
        for m in methods:
            table.add_column(m)
        for ds, by_method in metrics["by_dataset"].items():
            table.add_row(ds, *[f"{by_method[m][-1]['accuracy']:.3f}" if m in by_method else "-" for m in methods])
        console.print(table)


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
        ax.plot([r["round"] for r in curve], [r["accuracy"] for r in curve], marker="o", label=method)
    # One grey band: the 95 % interval of a chance-level accuracy at this round size,
    # i.e. how far apart two methods must be before the gap means anything.
    n = min(r["n"] for c in by_method.values() for r in c)
    if n > 0:
        from ragsieve.eval.classification import accuracy_interval

        lo, hi = accuracy_interval(n // 2, n)
        ax.axhspan(lo, hi, color="grey", alpha=0.15, label=f"95 % CI of 50 % at n={n}")
    ax.set_xlabel("round t (M_{t-1} evaluated on D_t)")
    ax.set_ylabel("accuracy")
    ax.set_xticks(sorted({r["round"] for c in by_method.values() for r in c}))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
