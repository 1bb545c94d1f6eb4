"""`ragsieve run experiments/evolve_m0_sweep.yaml`: choose M0's SFT recipe per dataset on a dev set.

Stage 0 of issue #16 found M0 under-fitted where it failed (its SFT loss ends at ln 2 and it is
wrong on its own training examples), so the recipe, not the data, is the first lever. For each
dataset and learning rate, one SFT run of ``max_epochs`` epochs on the same SFT set as the scale
run (same sizes, seed and prompts, so the chosen recipe's M0 is the one the scale run retrains)
is scored on a dev set after every epoch: the learning rate is constant, so the model after
epoch k is the one an ``epochs = k`` run ends with, and one run prices every epoch count.

The dev set (:func:`~ragsieve.evolve.tasks.select_dev`) is made of whole queries that are in
neither the test set, nor M0's set, nor any round: the test set stays untouched for the final
numbers and the rounds' labels stay unseen (CautiousDPO must not use them). The winner's dev
accuracy is the best of ``len(lrs) × max_epochs`` and so optimistic; its test accuracy in the
scale run is the unbiased figure.

Outputs: ``cells/<dataset>/lr=<lr>.json`` (per epoch: each dev example's right/wrong, verdict and
margin, AUROC with a query-bootstrap interval, share "true", accuracy on 40 SFT examples, the loss)
and ``metrics.json`` (per dataset: the grid, the chosen recipe, chosen vs the configured
``m0_train`` on the dev set, and the ``m0_train_overrides`` entry for the scale configs).
Resumable: finished learning rates are skipped, a killed one resumes from its checkpoint (every
``checkpoint_steps`` steps and after every epoch's scoring).

A dev set holds several examples per query where the dataset does (BioASQ: a question's snippets;
MultiRC: a passage's answers), and those are not independent. So ``metrics.json`` gives every dev
accuracy an interval over whole queries (Wilson where each example is its own query), and chosen vs
configured is the paired bootstrap over queries (exact McNemar where each example is its own query),
Holm-adjusted over the datasets' comparisons (:func:`~studies.evolve_stats.paired_outcomes`).
``ragsieve run --report-only experiments/evolve_m0_sweep.yaml`` rebuilds ``metrics.json`` from the
committed cells and the dev set's query ids (:meth:`EvolveM0Sweep.report`); it trains nothing.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field
from rich.console import Console
from rich.table import Table

from ragsieve.errors import RagsieveError
from studies.common import write_json
from studies.evolve import EvolveExperiment, EvolveExperimentConfig


class EvolveM0SweepConfig(EvolveExperimentConfig):
    """The scale run's settings (so the SFT sets are the same) plus the grid."""

    lrs: list[float] = [2e-4, 5e-4, 1e-3]
    # A dataset's own learning rates where an epoch costs too much for the full grid (MultiRC's
    # 297-token prompts: ≈ 14 min per epoch on 2 cores); keep the configured lr in it for the McNemar.
    lrs_by_dataset: dict[str, list[float]] = {}
    max_epochs: int = Field(4, ge=1)
    dev_size: int = Field(200, ge=2)
    fit_sample: int = Field(40, ge=0)  # SFT examples re-scored after each epoch: does M0 fit its own data?

    DATASET_KEYED: ClassVar[tuple[str, ...]] = (*EvolveExperimentConfig.DATASET_KEYED, "lrs_by_dataset")


class EvolveM0Sweep:
    """The study behind ``experiment: evolve_m0_sweep``.

    Example::

        cfg = EvolveM0SweepConfig(datasets=["bioasq"], lrs=[2e-4, 5e-4], max_epochs=2, test_size=300)
        EvolveM0Sweep().run(cfg, Path("results/evolve_m0_sweep"), Console())
        EvolveM0Sweep().report(cfg, Path("results/evolve_m0_sweep"), Console())  # metrics.json only
    """

    Config = EvolveM0SweepConfig

    def run(self, cfg: EvolveM0SweepConfig, out_dir: Path, console: Console) -> dict:
        from ragsieve.evolve.tasks import select_dev

        t0 = time.perf_counter()
        if cfg.m0 != "per-dataset":
            raise RagsieveError("the M0 sweep chooses a recipe per dataset; set m0: per-dataset")
        cfg.check()
        if cfg.threads:
            import torch

            torch.set_num_threads(cfg.threads)
        work = out_dir / "work"
        work.mkdir(parents=True, exist_ok=True)
        (work / ".gitignore").write_text("*\n")
        study = EvolveExperiment()
        by_dataset: dict[str, Any] = {}
        for ds in cfg.datasets:
            task = study._task(cfg, ds)
            lrs = cfg.lrs_by_dataset.get(ds, cfg.lrs)
            dev = select_dev(task, cfg.dev_size, cfg.seed)
            fit = random.Random(f"{cfg.seed}:fit").sample(sorted(task.initial, key=lambda x: x.id),
                                                        min(cfg.fit_sample, len(task.initial)))
            console.print(f"[bold]{ds}[/]: SFT set {len(task.initial)}, dev {len(dev)} "
                          f"({sum(x.label for x in dev)} true), grid lr {lrs} × epochs 1..{cfg.max_epochs}")
            runs = {}
            for lr in lrs:
                runs[lr] = self._run_lr(cfg, study, task, dev, fit, lr, out_dir, console)
            by_dataset[ds] = self._summarise(cfg, ds, dev, runs)
        return self._write_metrics(cfg, by_dataset, out_dir, console, t0)

    def report(self, cfg: EvolveM0SweepConfig, out_dir: Path, console: Console) -> dict:
        """``metrics.json`` from the finished cells (``ragsieve run --report-only``): trains and scores nothing.

        The dev set is rebuilt (:func:`~ragsieve.evolve.tasks.select_dev`, deterministic) for its query ids,
        which the cells do not store; a cell made under other settings or on another dev set stops it.
        """
        from ragsieve.evolve.tasks import select_dev

        t0 = time.perf_counter()
        cfg.check()
        study = EvolveExperiment()
        by_dataset: dict[str, Any] = {}
        for ds in cfg.datasets:
            task = study._task(cfg, ds)
            dev = select_dev(task, cfg.dev_size, cfg.seed)
            runs = {}
            for lr in cfg.lrs_by_dataset.get(ds, cfg.lrs):
                path = self._cell(out_dir, ds, lr)
                if not path.exists():
                    raise RagsieveError(f"{path} is missing: run the sweep first (without --report-only)")
                done = json.loads(path.read_text())
                if done.get("key") != self._key(cfg, task, dev, lr):
                    raise RagsieveError(f"{path} was made under other settings or on another dev set")
                runs[lr] = done
            by_dataset[ds] = self._summarise(cfg, ds, dev, runs)
        return self._write_metrics(cfg, by_dataset, out_dir, console, t0)

    def _write_metrics(self, cfg, by_dataset: dict[str, Any], out_dir: Path, console: Console, t0: float) -> dict:
        """``metrics.json``: the datasets' summaries, chosen vs configured Holm-adjusted as one family."""
        from studies.evolve_stats import add_holm

        add_holm({ds: r["chosen_vs_configured"] for ds, r in by_dataset.items()})
        metrics = {"experiment": "evolve_m0_sweep", "by_dataset": by_dataset, "pooled": pooled_recipe(by_dataset),
                   "m0_train_overrides": {ds: r["override"] for ds, r in by_dataset.items() if r["override"]},
                   "settings": {"lrs": cfg.lrs, "lrs_by_dataset": cfg.lrs_by_dataset, "max_epochs": cfg.max_epochs,
                                "dev_size": cfg.dev_size, "m0_train": cfg.m0_train.model_dump(), "seed": cfg.seed},
                   "seconds": round(time.perf_counter() - t0, 1)}
        write_json(out_dir / "metrics.json", metrics)
        self._print(by_dataset, console)
        return metrics

    @staticmethod
    def _cell(out_dir: Path, ds: str, lr: float) -> Path:
        return out_dir / "cells" / ds / f"lr={lr:g}.json"

    @staticmethod
    def _key(cfg, task, dev, lr: float) -> dict[str, Any]:
        """What a learning rate's cell depends on: a finished cell is reused (or reported) only under this key."""
        config = cfg.m0_train_for(task.dataset).model_copy(
            update={"lr": lr, "epochs": cfg.max_epochs, "seed": cfg.seed})
        return {"train": config.model_dump(), "dev": [x.id for x in dev], "initial": [x.id for x in task.initial],
                "llm": cfg.llm, "max_prompt_tokens": cfg.max_prompt_tokens}

    def _run_lr(self, cfg, study, task, dev, fit, lr: float, out_dir: Path, console: Console) -> dict:
        """One SFT run at ``lr``, scored on dev after each epoch (resumable)."""
        from ragsieve.evolve.train import trainer_class
        from ragsieve.models.training import TrainingCheckpoint
        from studies.evolve import score_examples
        from studies.evolve_stats import m0_auroc

        ds = task.dataset
        path = self._cell(out_dir, ds, lr)
        config = cfg.m0_train_for(ds).model_copy(update={"lr": lr, "epochs": cfg.max_epochs, "seed": cfg.seed})
        key = self._key(cfg, task, dev, lr)
        if path.exists():
            done = json.loads(path.read_text())
            if done.get("key") != key:
                raise RagsieveError(f"{path} was made under other settings; delete it or use another out_dir")
            return done
        partial_path = path.with_suffix(".epochs.json")  # per-epoch scores of a run in progress
        epochs: dict[str, Any] = {}
        if partial_path.exists():
            partial = json.loads(partial_path.read_text())
            epochs = partial["epochs"] if partial.get("key") == key else {}
        ranker = study._ranker(cfg, ds)  # a fresh base LLM: each learning rate starts from it
        prompts = ranker.prompts(task.initial)
        labels = [x.label for x in task.initial]
        trainer = trainer_class("sft", config)(ranker.llm, ranker.tokens, config)
        dev_ids, dev_queries = [x.id for x in dev], [x.query_id for x in dev]

        def on_epoch_end(epoch: int, so_far) -> None:
            if str(epoch) in epochs:
                return
            start = time.perf_counter()
            scored = score_examples(ranker, dev)
            own = score_examples(ranker, fit) if fit else None
            epochs[str(epoch)] = {
                "dev": {**scored, "auroc_ci95": m0_auroc({"test": scored, "test_ids": dev_ids,
                                                          "test_query_ids": dev_queries})["ci95"]},
                "fit_sample": {k: own[k] for k in ("n", "accuracy", "ci95")} if own else None,
                "loss_last_epoch": self._epoch_loss(so_far.losses, len(prompts), config.batch_size),
                "eval_seconds": round(time.perf_counter() - start, 1),
            }
            write_json(partial_path, {"key": key, "epochs": epochs})
            d = epochs[str(epoch)]["dev"]
            console.print(f"  {ds} lr={lr:g} epoch {epoch}: dev accuracy {d['accuracy']:.3f} {d['ci95']} "
                          f"AUROC {d['auroc']} true-rate {d['positive_rate']}")

        checkpoint = (TrainingCheckpoint(out_dir / "work" / ds / f"lr={lr:g}.checkpoint", cfg.checkpoint_steps,
                                         tag=json.dumps(key, sort_keys=True)) if cfg.checkpoint_steps else None)
        console.print(f"  {ds}: SFT at lr={lr:g} for {cfg.max_epochs} epochs ({len(prompts)} examples)")
        result = trainer.fit(prompts, labels, checkpoint=checkpoint, on_epoch_end=on_epoch_end)
        if checkpoint is not None:
            checkpoint.clear()
        missing = [e for e in range(1, cfg.max_epochs + 1) if str(e) not in epochs]
        if missing:
            raise RagsieveError(f"{ds} lr={lr:g}: epochs {missing} were not scored; delete {partial_path} and rerun")
        done = {"dataset": ds, "lr": lr, "key": key, "epochs": epochs, "train": result.summary(),
                "truncated_prompts": ranker.prompter.truncated}
        write_json(path, done)
        partial_path.unlink(missing_ok=True)
        return done

    @staticmethod
    def _epoch_loss(losses: list[float], n: int, batch_size: int) -> float | None:
        """Mean training loss over the last epoch's steps."""
        per_epoch = -(-n // batch_size)
        tail = losses[-per_epoch:]
        return round(sum(tail) / len(tail), 4) if tail else None

    @staticmethod
    def _summarise(cfg, ds: str, dev, runs: dict[float, dict]) -> dict[str, Any]:
        """The grid, the chosen recipe (best dev accuracy; ties → fewer epochs, then lower lr) and its paired test,
        every interval and test over whole queries where the dev set's queries repeat."""
        from studies.evolve_stats import clustered, paired_outcomes, score_summary

        queries = [x.query_id for x in dev]
        grid = []
        for lr, run in runs.items():
            for e, r in sorted(run["epochs"].items(), key=lambda kv: int(kv[0])):
                d = r["dev"]
                if len(d["correct"]) != len(dev):
                    raise RagsieveError(f"{ds} lr={lr:g} epoch {e}: {len(d['correct'])} dev outcomes for {len(dev)} "
                                        "dev examples")
                acc = score_summary([int(c) for c in d["correct"]], query_ids=queries)
                grid.append({"lr": lr, "epochs": int(e), "accuracy": acc["accuracy"], "ci95": acc["ci95"],
                             "auroc": d["auroc"], "auroc_ci95": d["auroc_ci95"], "positive_rate": d["positive_rate"],
                             "fit_sample_accuracy": (r["fit_sample"] or {}).get("accuracy"),
                             "loss_last_epoch": r["loss_last_epoch"], "correct": d["correct"]})
        best = _best_recipe(grid, "accuracy")
        base = cfg.m0_train_for(ds)
        configured = next((g for g in grid if abs(g["lr"] - base.lr) < 1e-12 and g["epochs"] == base.epochs), None)
        paired = None
        if configured is not None and configured is not best:
            paired = paired_outcomes([int(c) for c in best["correct"]], [int(c) for c in configured["correct"]],
                                     queries)
            paired["chosen_only"], paired["configured_only"] = paired.pop("a_only"), paired.pop("b_only")
        chosen = {"lr": best["lr"], "epochs": best["epochs"]}
        override = {} if configured is best else {k: v for k, v in chosen.items() if v != getattr(base, k)}
        unit = ({"interval": "bootstrap over queries", "queries": len(set(queries))} if clustered(queries)
                else {"interval": "Wilson (each example its own query)", "queries": len(set(queries))})
        return {"dev": {"n": len(dev), "positives": sum(x.label for x in dev), **unit},
                "grid": [{k: v for k, v in g.items() if k != "correct"} for g in grid],
                "chosen": {**chosen, "dev_accuracy": best["accuracy"], "ci95": best["ci95"], "auroc": best["auroc"]},
                "configured": ({"lr": base.lr, "epochs": base.epochs, "dev_accuracy": configured["accuracy"],
                                "ci95": configured["ci95"], "auroc": configured["auroc"]} if configured else None),
                "chosen_vs_configured": paired, "override": override}

    @staticmethod
    def _print(by_dataset: dict, console: Console) -> None:
        table = Table(title="M0 recipe on the dev set (best dev accuracy chosen)")
        for col in ("dataset", "configured", "chosen", "dev acc [95 % CI]", "AUROC", "vs configured"):
            table.add_column(col)
        for ds, r in by_dataset.items():
            c, b, p = r["chosen"], r["configured"], r["chosen_vs_configured"]
            table.add_row(ds, f"lr {b['lr']:g} × {b['epochs']}: {b['dev_accuracy']:.3f}" if b else "—",
                          f"lr {c['lr']:g} × {c['epochs']}", f"{c['dev_accuracy']:.3f} {c['ci95']}", str(c["auroc"]),
                          f"{p['diff']:+.3f} (p={p['p_value']:.3g}, Holm {p['p_holm']:.3g})" if p else "same")
        console.print(table)


def _best_recipe(grid: list[dict[str, Any]], score: str) -> dict[str, Any]:
    """The grid row with the highest ``score``; ties → fewer epochs, then lower lr (the cheaper recipe)."""
    return max(grid, key=lambda g: (g[score], -g["epochs"], -g["lr"]))


def pooled_recipe(by_dataset: dict[str, Any]) -> dict[str, Any] | None:
    """The recipe with the best mean dev accuracy over the swept datasets, on the grid they share.

    For a dataset too small for a dev set of its own (PubMedQA): the rule is fixed before its M0 is
    trained, so its test set stays untouched. Ties as per dataset (:func:`_best_recipe`).

    Example::

        >>> grid = lambda a, b: {"grid": [{"lr": 1e-3, "epochs": 1, "accuracy": a}, {"lr": 1e-3, "epochs": 2, "accuracy": b}]}
        >>> pooled_recipe({"x": grid(0.6, 0.7), "y": grid(0.6, 0.5)})["chosen"]
        {'lr': 0.001, 'epochs': 1, 'mean_dev_accuracy': 0.6}
    """
    if not by_dataset:
        return None
    per_ds = {ds: {(g["lr"], g["epochs"]): g["accuracy"] for g in r["grid"]} for ds, r in by_dataset.items()}
    shared = set.intersection(*(set(g) for g in per_ds.values()))
    if not shared:
        return None
    grid = [{"lr": lr, "epochs": e, "mean_dev_accuracy": round(sum(g[(lr, e)] for g in per_ds.values()) / len(per_ds), 4),
             "per_dataset": {ds: g[(lr, e)] for ds, g in per_ds.items()}} for lr, e in sorted(shared)]
    best = _best_recipe(grid, "mean_dev_accuracy")
    return {"datasets": list(per_ds), "grid": grid,
            "chosen": {"lr": best["lr"], "epochs": best["epochs"], "mean_dev_accuracy": best["mean_dev_accuracy"]}}
