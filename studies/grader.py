"""`ragsieve run experiments/grader.yaml`: the lightweight-grader study (paper Tables II–V).

Builds the grading dataset (top-5 dense retrieval over several benchmarks, gold or
LLM-judge labels, 80/20 split by query), then trains and evaluates every grader
configuration on the same held-out queries: the prompted baseline, A (generative full
fine-tune), B (frozen backbone + head), C (sequence classification), the loss
comparison (cross-entropy vs contrastive margin), the LoRA rank × alpha grid and the
cosine / cross-encoder baselines.

The full run is long, so it is resumable per configuration: each one's metrics are
written to ``configs/<name>.json`` the moment it finishes and a rerun skips every
configuration whose settings and data are unchanged. The backbone's final states,
which the prompted baseline and config B both read, are computed once and cached.

Every query contributes its top 5 pairs, and a query's pairs are not independent: the 95 %
intervals resample whole test queries (a cluster bootstrap). ``test_pairs.json`` keeps the test
split's ids, query ids and labels (no text), so ``ragsieve run --report-only`` rebuilds
``metrics.json`` from the stored test scores without the pairs' text, a model or any training.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import field_validator
from rich.console import Console
from rich.table import Table

from ragsieve.config import StrictConfig, build_config
from ragsieve.errors import RagsieveError
from ragsieve.grade.dataset import GradingDataConfig, GradingPair
from ragsieve.grade.train import GraderTrainConfig
from ragsieve.models.specs import DEFAULT_ENCODER, DEFAULT_LLM
from studies.common import progress_bar

METRIC_KEYS = ("accuracy", "precision", "recall", "f1")
# What the retriever's score is, for the histogram's axis.
_SCORE_NAMES = {"dense": "cosine similarity (query, passage), MiniLM", "bm25": "BM25 score", "hybrid": "RRF score"}


def _check_train_overrides(value: dict[str, Any]) -> dict[str, Any]:
    # Validate the keys here so a typo fails before hours of training, not inside a run.
    build_config(GraderTrainConfig, value, "train")
    return value


class GraderRunSpec(StrictConfig):
    """One grader configuration; ``train`` overrides the experiment-wide training settings."""

    kind: Literal["prompted", "generative", "head", "classifier", "lora"]
    train: dict[str, Any] = {}
    lora_r: int | None = None
    lora_alpha: int | None = None

    _check_train = field_validator("train")(_check_train_overrides)


class LoraGridConfig(StrictConfig):
    """The LoRA grid (paper Table V): every rank × alpha, each a config C with adapters."""

    ranks: list[int] = [16, 128]
    alphas: list[int] = [16, 32, 64, 128]
    train: dict[str, Any] = {}

    _check_train = field_validator("train")(_check_train_overrides)


def _default_configs() -> dict[str, GraderRunSpec]:
    return {
        "prompted": GraderRunSpec(kind="prompted"),
        "A": GraderRunSpec(kind="generative"),
        "B": GraderRunSpec(kind="head", train={"lr": 1e-3, "epochs": 20}),
        "C": GraderRunSpec(kind="classifier"),
    }


class GraderExperimentConfig(StrictConfig):
    llm: str = DEFAULT_LLM
    data: GradingDataConfig = GradingDataConfig()
    teacher: Literal["gold", "judge"] = "gold"
    judge_llm: str | None = None  # any load_llm spec, e.g. openai:http://host:8000/v1#model
    judge_max_new_tokens: int = 8
    max_length: int = 512
    max_passage_tokens: int = 192
    max_query_tokens: int = 96
    eval_batch_size: int = 16
    train: GraderTrainConfig = GraderTrainConfig()
    configs: dict[str, GraderRunSpec] = _default_configs()
    # Each listed config is also trained with every other loss in `losses`.
    loss_comparison: list[str] = ["B", "C"]
    losses: list[Literal["cross_entropy", "contrastive"]] = ["cross_entropy", "contrastive"]
    # ... and with every other skew handling in `samplings` (the labels are ~30 % relevant).
    sampling_comparison: list[str] = ["C"]
    samplings: list[Literal["none", "oversample", "undersample"]] = ["none", "oversample", "undersample"]
    lora_grid: LoraGridConfig | None = LoraGridConfig()
    cosine_baseline: bool = True
    encoder: str = DEFAULT_ENCODER  # for the cosine baseline and the histogram
    cross_encoder: str | None = None  # a cross-encoder folder → the cross-encoder baseline
    save_models: list[str] = ["C"]  # configs whose trained grader is saved to models/<name>
    target_config: str = "C"
    target_precision: float = 0.75
    target_recall: float = 0.60
    # The operating point every grader is also compared at: its threshold tuned on train for
    # the best F1 with precision >= select_precision (None: only the configs' own thresholds).
    select_precision: float | None = None
    threshold_pairs: int = 800  # train pairs a trained LLM grader scores to tune that threshold
    bootstrap: int = 1000  # resamples for the 95 % intervals of precision / recall / F1
    # Ship the best grader at that operating point that can ship (≤ 50 MB: a ranker + threshold,
    # a head, an adapter) to this folder, e.g. ragsieve/assets/graders/default.
    ship_to: str | None = None


@dataclass
class Job:
    """One configuration to train (or not) and evaluate."""

    name: str
    kind: str
    train: GraderTrainConfig
    lora_r: int | None = None
    lora_alpha: int | None = None

    def settings(self, cfg: GraderExperimentConfig, data_key: str) -> dict[str, Any]:
        """Everything the result depends on; a stored result with other settings is recomputed."""
        return {
            "kind": self.kind, "llm": cfg.llm, "lora_r": self.lora_r, "lora_alpha": self.lora_alpha,
            "train": self.train.model_dump() if self.kind != "prompted" else None,
            "prompt": [cfg.max_length, cfg.max_passage_tokens, cfg.max_query_tokens], "data": data_key,
        }


def plan_jobs(cfg: GraderExperimentConfig) -> list[Job]:
    """The configs, their loss-comparison twins and the LoRA grid, in run order (cheap first)."""
    def merged(overrides: dict[str, Any]) -> GraderTrainConfig:
        return build_config(GraderTrainConfig, {**cfg.train.model_dump(), **overrides}, "train")

    jobs: dict[str, Job] = {}
    for name, spec in cfg.configs.items():
        jobs[name] = Job(name, spec.kind, merged(spec.train), spec.lora_r, spec.lora_alpha)
    for field, names, values in (("loss", cfg.loss_comparison, cfg.losses),
                                 ("sampling", cfg.sampling_comparison, cfg.samplings)):
        for name in names:
            if name not in cfg.configs:
                raise RagsieveError(f"{field}_comparison names '{name}', which is not in configs ({', '.join(cfg.configs)})")
            base = jobs[name]
            if base.kind == "prompted":
                raise RagsieveError(f"{field}_comparison: '{name}' is the prompted baseline; it is not trained")
            for value in values:
                if value != getattr(base.train, field):
                    twin = f"{name}+{value}"
                    train = base.train.model_copy(update={field: value})
                    jobs[twin] = Job(twin, base.kind, train, base.lora_r, base.lora_alpha)
    if cfg.lora_grid:
        for r in cfg.lora_grid.ranks:
            for a in cfg.lora_grid.alphas:
                name = f"lora_r{r}_a{a}"
                jobs[name] = Job(name, "lora", merged(cfg.lora_grid.train), r, a)
    for name in cfg.save_models:
        if name not in jobs:
            raise RagsieveError(f"save_models names '{name}', which is not a config ({', '.join(jobs)})")
    cost = {"prompted": 0, "head": 1, "classifier": 2, "generative": 3, "lora": 4}  # the target config C early
    return sorted(jobs.values(), key=lambda j: cost[j.kind])  # stable: yaml order within a kind


class _Split:
    """The pairs of one split as parallel lists (ids, query ids and labels only for a report: no text)."""

    def __init__(self, pairs: list[GradingPair]):
        self.ids = [p.id for p in pairs]
        self.query_ids = [p.query_id for p in pairs]
        self.queries = [p.query for p in pairs]
        self.passages = [p.passage for p in pairs]
        self.labels = np.array([p.label for p in pairs], dtype=np.int64)
        self.empty = np.array([not p.passage.strip() for p in pairs], dtype=bool)  # never relevant
        self.rebuilt_data_key: str | None = None  # set when the ids come from pairs rebuilt after the run

    def __len__(self) -> int:
        return len(self.labels)

    def record(self, data_key: str) -> dict:
        """What ``test_pairs.json`` keeps: enough to recompute every test metric and interval from stored scores."""
        out = {"data_key": data_key, "ids": self.ids, "query_ids": self.query_ids,
               "labels": self.labels.tolist(), "empty_passages": np.flatnonzero(self.empty).tolist()}
        return out | ({"rebuilt_data_key": self.rebuilt_data_key} if self.rebuilt_data_key else {})

    @classmethod
    def from_record(cls, record: dict) -> "_Split":
        split = cls([])
        split.ids, split.query_ids = list(record["ids"]), list(record["query_ids"])
        split.labels = np.asarray(record["labels"], dtype=np.int64)
        split.empty = np.zeros(len(split.labels), dtype=bool)
        split.empty[record["empty_passages"]] = True
        split.rebuilt_data_key = record.get("rebuilt_data_key")
        return split


TEST_PAIRS = "test_pairs.json"


def _rate(numerator: str, denominator: str) -> Callable[[np.ndarray, np.ndarray], float]:
    """Precision (tp / predicted) or recall (tp / relevant) of 0/1 arrays, 0 when undefined (as
    scikit-learn's ``zero_division=0``): numpy, for the bootstrap's thousands of resamples."""
    def rate(y: np.ndarray, p: np.ndarray) -> float:
        tp = float(np.sum((y == 1) & (p == 1)))
        total = float(np.sum((p if denominator == "predicted" else y) == 1))
        return tp / total if total else 0.0
    rate.__name__ = numerator
    return rate


def _f1(y: np.ndarray, p: np.ndarray) -> float:
    tp = float(np.sum((y == 1) & (p == 1)))
    total = float(np.sum(y == 1) + np.sum(p == 1))
    return 2 * tp / total if total else 0.0


RATES = {"precision": _rate("precision", "predicted"), "recall": _rate("recall", "relevant"), "f1": _f1}


class GraderExperiment:
    Config = GraderExperimentConfig

    def run(self, cfg: GraderExperimentConfig, out_dir: Path, console: Console) -> dict:
        from ragsieve.grade.dataset import label_skew, plot_score_histogram

        t0 = time.perf_counter()
        jobs = plan_jobs(cfg)  # fail on a bad config before any work
        pairs, teacher = self._pairs(cfg, out_dir, console)
        train = _Split([p for p in pairs if p.split == "train"])
        test = _Split([p for p in pairs if p.split == "test"])
        if len(set(train.labels.tolist())) < 2 or len(test) == 0:
            raise RagsieveError("the grading data needs both labels in train and a non-empty test split; add queries")
        data_key = hashlib.sha1(
            json.dumps([(p.id, p.label, p.split) for p in pairs]).encode()
        ).hexdigest()[:16]
        skew = label_skew(pairs)
        # The paper's Fig. 4: how far the retrieval cosine alone separates the labels.
        plot_score_histogram(
            [p.score for p in pairs], [p.label for p in pairs], out_dir / "cosine_histogram.png",
            f"{cfg.data.retriever} retrieval score: relevant vs not relevant ({len(pairs)} pairs)",
            xlabel=_SCORE_NAMES.get(cfg.data.retriever, f"{cfg.data.retriever} retrieval score"),
        )
        console.print(
            f"{len(pairs)} pairs from {skew['queries']} queries, {skew['positive_rate']:.1%} relevant; "
            f"train {len(train)} / test {len(test)}"
        )
        _write_json(out_dir / TEST_PAIRS, test.record(data_key))

        runner = _Runner(cfg, out_dir, console, train, test, data_key)
        results: dict[str, dict] = {}
        if cfg.cosine_baseline:
            results["cosine"] = runner.baseline("cosine", cfg.encoder)
        if cfg.cross_encoder:
            results["cross-encoder"] = runner.baseline("cross-encoder", cfg.cross_encoder)
        for job in jobs:
            results[job.name] = runner.run(job)

        selection = runner.select(results, jobs) if cfg.select_precision is not None else None
        out = {
            **_summary(cfg, jobs, results, selection),
            "label_skew": skew,
            "teacher": teacher,
            "data": {
                "sources": cfg.data.sources, "queries_per_source": cfg.data.queries_per_source,
                "top_k": cfg.data.top_k, "retriever": cfg.data.retriever, "train_pairs": len(train),
                "test_pairs": len(test), "test_queries": len(set(test.query_ids)), "data_key": data_key,
            },
            "seconds": time.perf_counter() - t0,
            "config": cfg.model_dump(),
        }
        _write_json(out_dir / "metrics.json", out)
        _print_table(console, results, test)
        if selection:
            console.print(f"default grader at precision >= {cfg.select_precision}: [bold]{selection['best_shippable']}[/]"
                          f" ({selection['versus_runner_up']})")
        console.print(f"wrote {out_dir / 'metrics.json'} in {out['seconds']:.0f}s")
        return out

    def report(self, cfg: GraderExperimentConfig, out_dir: Path, console: Console) -> dict:
        """metrics.json again from what the run stored: each config's test scores and thresholds
        (``configs/<name>.json``) and the test split (``test_pairs.json``); trains and scores nothing.

        Recomputes every interval and the paired comparisons (by query), checks that each stored point
        estimate comes out the same (else the stored scores belong to other pairs), and keeps the rest of
        metrics.json (data, timings, config) as the run wrote it. Nothing is shipped.
        """
        jobs = plan_jobs(cfg)
        if not (out_dir / "metrics.json").is_file():
            raise RagsieveError(f"{out_dir / 'metrics.json'} does not exist: run the study first")
        previous = json.loads((out_dir / "metrics.json").read_text())
        data_key = previous["data"]["data_key"]
        if (out_dir / TEST_PAIRS).is_file():
            test = _Split.from_record(json.loads((out_dir / TEST_PAIRS).read_text()))
        else:  # a run from before test_pairs.json: its test split from pairs.jsonl, which the run wrote
            test = _Split.from_record(_test_record(out_dir / "pairs.jsonl", data_key))
            _write_json(out_dir / TEST_PAIRS, test.record(data_key))
        if test.rebuilt_data_key:
            console.print(f"[yellow]{out_dir / 'pairs.jsonl'} was rebuilt since the run (data key "
                          f"{test.rebuilt_data_key}, the run's {data_key}): its test split is used only if every "
                          "stored precision, recall and F1 recomputes from it[/]")
        runner = _Runner(cfg, out_dir, console, None, test, data_key)
        names = [*(["cosine"] if cfg.cosine_baseline else []), *(["cross-encoder"] if cfg.cross_encoder else []),
                 *(j.name for j in jobs)]
        results = {name: runner.rescore(name) for name in names if runner._result_file(name).is_file()}
        missing = [j for j in jobs if j.name not in results]
        if missing:
            raise RagsieveError(f"no stored result for {', '.join(j.name for j in missing)} in {out_dir / 'configs'}; "
                                "run the study to finish them")
        selection = runner.select(results, jobs, ship=False) if cfg.select_precision is not None else None
        if selection and (previous.get("selection") or {}).get("shipped_to"):
            selection["shipped_to"] = previous["selection"]["shipped_to"]
        out = {**previous, **_summary(cfg, jobs, results, selection)}
        out["data"]["test_queries"] = len(set(test.query_ids))
        _write_json(out_dir / "metrics.json", out)
        _print_table(console, results, test)
        console.print(f"wrote {out_dir / 'metrics.json'} from {len(results)} stored configs")
        return out

    def _pairs(self, cfg: GraderExperimentConfig, out_dir: Path, console: Console) -> tuple[list[GradingPair], dict]:
        """The labelled, split pairs: read back from ``pairs.jsonl`` when its card shows the same
        data and teacher settings, else retrieved, labelled and split anew (BioASQ's dense index
        alone is ≈ 20 min on one thread, and a judge's labels cost far more)."""
        from ragsieve.grade.dataset import assign_splits, build_grading_pairs, read_grading_pairs, write_grading_pairs

        pairs_file, card_file = out_dir / "pairs.jsonl", out_dir / "pairs.json"
        settings = {"data": cfg.data.model_dump(), "teacher": cfg.teacher, "judge_llm": cfg.judge_llm}
        if pairs_file.is_file() and card_file.is_file():
            card = json.loads(card_file.read_text())
            if card.get("settings") == settings:
                console.print(f"[dim]reusing {pairs_file} (same data and teacher settings)[/]")
                return read_grading_pairs(pairs_file, data_dir=cfg.data.data_dir), card["teacher"]
        pairs = build_grading_pairs(cfg.data, progress=lambda msg: console.print(f"[dim]{msg}[/]"))
        teacher = {"teacher": "gold"}
        if cfg.teacher == "judge":
            pairs, teacher = self._judge(cfg, pairs, out_dir, console)
        pairs = assign_splits(pairs, cfg.data.test_fraction, cfg.data.seed)
        write_grading_pairs(pairs_file, pairs, stripped=True)  # ids and labels: the text is joined back on reuse
        card_file.write_text(json.dumps({"settings": settings, "teacher": teacher}, indent=1) + "\n")
        return pairs, teacher

    def _judge(
        self, cfg: GraderExperimentConfig, pairs: list[GradingPair], out_dir: Path, console: Console
    ) -> tuple[list[GradingPair], dict]:
        from ragsieve.grade.dataset import apply_judge_labels
        from ragsieve.grade.judge import LLMJudge
        from ragsieve.models import load_llm

        if not cfg.judge_llm:
            raise RagsieveError("teacher: judge needs judge_llm (a local model or openai:<url>#<model>)")
        judge = LLMJudge(
            load_llm(cfg.judge_llm), out_dir / "judge_labels.jsonl", max_new_tokens=cfg.judge_max_new_tokens
        )
        with progress_bar(console) as bar:
            task = bar.add_task(f"judge ({judge.spec})", total=len(pairs))
            report = judge.label(pairs, progress=lambda n: bar.advance(task, n))
        judged, dropped = apply_judge_labels(pairs, report.labels)
        gold = np.array([p.gold_label for p in judged])
        labels = np.array([p.label for p in judged])
        summary = {**report.summary(), "dropped_unparseable": dropped}
        if len(judged):
            from sklearn.metrics import cohen_kappa_score

            summary["agreement_with_gold"] = float((gold == labels).mean())
            both_seen = len(set(gold) | set(labels)) > 1
            summary["kappa_with_gold"] = float(cohen_kappa_score(gold, labels)) if both_seen else None
        console.print(f"judge: {summary}")
        return judged, {"teacher": "judge", **summary}


class _Runner:
    """Runs jobs against one dataset, with the per-config result files and the state cache."""

    def __init__(self, cfg: GraderExperimentConfig, out_dir: Path, console: Console, train: _Split | None,
                 test: _Split, data_key: str):
        self.cfg, self.out_dir, self.console = cfg, out_dir, console
        self.train, self.test, self.data_key = train, test, data_key
        self._states: tuple[np.ndarray, np.ndarray] | None = None
        self._empty_test = test.empty
        self.test_scores: dict[str, np.ndarray] = {}  # name → test scores (paired comparisons)
        self.kind_runners: dict[str, Callable[[Job], tuple[np.ndarray, dict]]] = {
            "prompted": self._prompted,
            "head": self._head,
            "generative": self._lm,
            "classifier": self._lm,
            "lora": self._lm,
        }

    # -- bookkeeping -------------------------------------------------------------------
    def _result_file(self, name: str) -> Path:
        return self.out_dir / "configs" / f"{name.replace('/', '_')}.json"

    def _cached(self, name: str, settings: dict) -> dict | None:
        file = self._result_file(name)
        if not file.is_file():
            return None
        try:
            stored = json.loads(file.read_text())
        except json.JSONDecodeError:
            return None  # a torn write: recompute
        if stored.get("settings") != settings:
            self.console.print(f"[yellow]{name}: settings or data changed since the stored result; rerunning[/]")
            return None
        if "test_scores" in stored:
            self.test_scores[name] = np.asarray(stored["test_scores"], dtype=np.float64)
        return stored["metrics"]

    def _point(self, scores: np.ndarray, threshold: float) -> dict:
        """Test precision / recall / F1 at ``threshold``, each with a bootstrap 95 % interval that resamples
        whole test queries (a query's 5 pairs together)."""
        from ragsieve.eval.classification import classification_metrics

        predicted = self._predict(scores, threshold)
        metrics = classification_metrics(self.test.labels, predicted, scores)
        metrics["threshold"] = float(threshold)
        metrics.update(self._intervals(predicted))
        return metrics

    def _intervals(self, predicted: np.ndarray) -> dict:
        from ragsieve.eval.stats import bootstrap_metric

        out = {}
        for key, rate in RATES.items():
            _, lo, hi = bootstrap_metric(rate, self.test.labels, predicted, groups=self.test.query_ids,
                                         n_boot=self.cfg.bootstrap)
            out[f"{key}_ci95"] = [lo, hi]
        return out

    def rescore(self, name: str) -> dict:
        """A stored config's metrics with its intervals recomputed from its stored test scores (the report);
        its point estimates must come out as stored."""
        file = self._result_file(name)
        stored = json.loads(file.read_text())
        if "test_scores" not in stored:
            raise RagsieveError(f"{file} keeps no test scores (a run from before they were stored): its intervals "
                                "cannot be recomputed; run the study again")
        scores = np.asarray(stored["test_scores"], dtype=np.float64)
        if len(scores) != len(self.test):
            raise RagsieveError(f"{file}: {len(scores)} test scores for {len(self.test)} test pairs; "
                                "the stored results belong to other pairs")
        metrics = stored["metrics"]
        points = [metrics] + ([metrics["operating_point"]] if "operating_point" in metrics else [])
        for point in points:
            predicted = self._predict(scores, point["threshold"])
            for key, rate in RATES.items():
                if abs(rate(self.test.labels, predicted) - point[key]) > 1e-9:
                    raise RagsieveError(f"{file}: {key} recomputes to {rate(self.test.labels, predicted):.4f}, "
                                        f"stored {point[key]:.4f}; the test pairs differ from the run's")
            point.update(self._intervals(predicted))
        self.test_scores[name] = scores
        _write_json(file, stored)
        return metrics

    def _predict(self, scores: np.ndarray, threshold: float) -> np.ndarray:
        """Test verdicts at ``threshold``; an empty passage is never relevant."""
        return ((scores >= threshold) & ~self._empty_test).astype(int)

    def _finish(self, name: str, settings: dict, scores: np.ndarray, threshold: float, extra: dict,
                train_scores: tuple[np.ndarray, np.ndarray] | None = None) -> dict:
        """Test metrics at the config's own threshold and, given (train scores, their labels), at the
        operating point: the threshold tuned on train for the best F1 with precision >= select_precision."""
        from ragsieve.eval.classification import best_threshold, plot_confusion_matrix

        metrics = self._point(scores, threshold)
        metrics.update(**extra)
        if self.cfg.select_precision is not None and train_scores is not None:
            tuned = best_threshold(train_scores[1], train_scores[0], "f1", min_precision=self.cfg.select_precision)
            point = self._point(scores, tuned)
            metrics["operating_point"] = {k: point[k] for k in (
                "threshold", "precision", "recall", "f1", "precision_ci95", "recall_ci95", "f1_ci95", "positive_rate")}
            metrics["operating_point"]["tuned_on_pairs"] = int(len(train_scores[0]))
        self.test_scores[name] = scores
        plot_confusion_matrix(
            metrics["confusion_matrix"], self.out_dir / "confusion" / f"{name}.png",
            f"{name}: test (n={metrics['n']})",
        )
        file = self._result_file(name)
        file.parent.mkdir(parents=True, exist_ok=True)
        _write_json(file, {"settings": settings, "metrics": metrics,
                           "test_scores": [round(float(x), 6) for x in scores]})
        self.console.print(
            f"[bold]{name}[/]: " + ", ".join(f"{k} {metrics[k]:.3f}" for k in METRIC_KEYS)
            + (f", AUROC {metrics['auroc']:.3f}" if metrics.get("auroc") is not None else "")
        )
        return metrics

    def _progress(self, name: str):

        bar = progress_bar(self.console)
        task = bar.add_task(f"train {name}", total=None)

        def update(step: int, total: int, loss: float) -> None:
            bar.update(task, completed=step, total=total, description=f"train {name} (loss {loss:.3f})")

        return bar, update

    # -- runs ----------------------------------------------------------------------------
    def run(self, job: Job) -> dict:
        settings = {**job.settings(self.cfg, self.data_key), **self._point_settings()}
        if (done := self._cached(job.name, settings)) is not None:
            self.console.print(f"[dim]{job.name}: done earlier, skipped[/]")
            return done
        start = time.perf_counter()
        scores, extra, train_scores = self.kind_runners[job.kind](job)
        extra["seconds_total"] = time.perf_counter() - start
        return self._finish(job.name, settings, scores, 0.5, extra, train_scores)

    def baseline(self, kind: str, base: str) -> dict:
        from ragsieve.registry import new_grader

        settings = {"kind": kind, "base": base, "data": self.data_key, **self._point_settings()}
        if (done := self._cached(kind, settings)) is not None:
            return done
        start = time.perf_counter()
        grader = new_grader(kind, base)
        train_scores = grader.score_pairs(self.train.queries, self.train.passages)
        threshold = grader.fit_threshold(train_scores, self.train.labels)
        t_eval = time.perf_counter()
        scores = grader.score_pairs(self.test.queries, self.test.passages)
        eval_seconds = time.perf_counter() - t_eval
        extra = {
            "seconds_total": time.perf_counter() - start, "eval_seconds": eval_seconds,
            "eval_pairs_per_s": len(scores) / max(eval_seconds, 1e-9), "tuned_on": "train f1",
        }
        return self._finish(kind, settings, scores, threshold, extra, (train_scores, self.train.labels))

    def select(self, results: dict[str, dict], jobs: list[Job], ship: bool = True) -> dict:
        """The best grader at the operating point (precision floor met first, then F1), the paired
        bootstrap (by query) of its F1 against the runner-up, and the best one that can ship (shipped if asked)."""
        from ragsieve.eval.stats import bootstrap_metric, verdict

        kinds = {j.name: j.kind for j in jobs}
        floor = self.cfg.select_precision
        ranked = sorted(
            (n for n in results if "operating_point" in results[n] and n in self.test_scores),
            key=lambda n: (results[n]["operating_point"]["precision"] >= floor, results[n]["operating_point"]["f1"]),
            reverse=True,
        )
        if not ranked:
            return {}

        def predicted(name: str) -> np.ndarray:
            return self._predict(self.test_scores[name], results[name]["operating_point"]["threshold"])

        def versus(a: str, b: str) -> dict:
            diff = lambda y, pa, pb: _f1(y, pa) - _f1(y, pb)  # noqa: E731
            est, lo, hi = bootstrap_metric(diff, self.test.labels, predicted(a), predicted(b),
                                           groups=self.test.query_ids, n_boot=self.cfg.bootstrap)
            # paired bootstrap (the same resampled queries for both): the interval alone decides
            return {"a": a, "b": b, "f1_diff": est, "ci95": [lo, hi], "verdict": verdict(0.0, est, lo, hi)}

        shippable = [n for n in ranked if n in ("cosine", "cross-encoder") or kinds.get(n) in ("head", "prompted", "lora")]
        out = {
            "precision_floor": floor,
            "ranking": [{"config": n, **{k: results[n]["operating_point"][k] for k in ("precision", "recall", "f1")},
                         "meets_floor": results[n]["operating_point"]["precision"] >= floor} for n in ranked],
            "best": ranked[0],
            "versus_runner_up": versus(ranked[0], ranked[1]) if len(ranked) > 1 else None,
            "best_shippable": shippable[0] if shippable else None,
        }
        if shippable and shippable[0] != ranked[0]:
            out["best_shippable_vs_best"] = versus(shippable[0], ranked[0])
        if shippable and self.cfg.ship_to and ship:
            out["shipped_to"] = str(self.ship(shippable[0], results[shippable[0]]))
        return out

    def ship(self, name: str, metrics: dict) -> Path:
        """Save the chosen grader with its operating-point threshold where the package ships it."""
        from ragsieve.atomic import atomic_directory
        from ragsieve.registry import load_grader, new_grader

        if name in ("cosine", "cross-encoder"):
            grader = new_grader(name, self.cfg.encoder if name == "cosine" else self.cfg.cross_encoder)
        elif (self.out_dir / "models" / name).is_dir():
            grader = load_grader(self.out_dir / "models" / name)
        else:
            raise RagsieveError(f"ship: '{name}' was not saved; add it to save_models and rerun")
        op = metrics["operating_point"]
        grader.config = grader.config.model_copy(update={"threshold": op["threshold"], "trained": {
            **grader.config.trained, "chosen_by": "experiments/grader_scale.yaml",
            "operating_point": {k: op[k] for k in ("precision", "recall", "f1", "precision_ci95", "recall_ci95",
                                                     "f1_ci95")},
            "precision_floor": self.cfg.select_precision, "test_pairs": len(self.test),
        }})
        target = Path(self.cfg.ship_to)
        # the study chose it on the same test pairs as every other grader: it replaces the shipped one
        with atomic_directory(target, overwrite=True) as tmp:
            grader.save(tmp)
        self.console.print(f"shipped {name} (threshold {op['threshold']:.4f}) to {target}")
        return target

    def _point_settings(self) -> dict:
        return {"select_precision": self.cfg.select_precision, "threshold_pairs": self.cfg.threshold_pairs,
                "bootstrap": self.cfg.bootstrap}

    def _new(self, job: Job):
        from ragsieve.registry import new_grader

        grader = new_grader(
            job.kind, self.cfg.llm, max_length=self.cfg.max_length, max_passage_tokens=self.cfg.max_passage_tokens,
            max_query_tokens=self.cfg.max_query_tokens, lora_r=job.lora_r, lora_alpha=job.lora_alpha,
        )
        grader.batch_size = self.cfg.eval_batch_size
        return grader

    def _final_states(self) -> tuple[np.ndarray, np.ndarray]:
        """Final last-token states of every train and test pair, computed once and cached on disk."""
        if self._states is not None:
            return self._states
        cache = self.out_dir / "cache"
        inputs = [self.cfg.llm, self.data_key, self.cfg.max_length, self.cfg.max_passage_tokens,
                  self.cfg.max_query_tokens]
        key = hashlib.sha1(json.dumps(inputs).encode()).hexdigest()[:16]
        file = cache / f"states-{key}.npz"
        if file.exists():
            data = np.load(file)
            self._states = (data["train"], data["test"])
            return self._states
        grader = self._new(Job("states", "head", self.cfg.train))
        start = time.perf_counter()
        with self.console.status(f"final states of {len(self.train) + len(self.test)} pairs (once)"):
            states = (
                grader.final_states(self.train.queries, self.train.passages),
                grader.final_states(self.test.queries, self.test.passages),
            )
        self.console.print(f"[dim]final states in {time.perf_counter() - start:.0f}s (cached in {file})[/]")
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".{file.name}"
        with open(tmp, "wb") as fh:
            np.savez(fh, train=states[0], test=states[1])
        tmp.replace(file)
        self._states = states
        return states

    def _prompted(self, job: Job) -> tuple[np.ndarray, dict]:
        train_states, test_states = self._final_states()
        grader = self._new(job)
        scores = grader.scores_from_states(test_states)
        scores[self._empty_test] = 0.0  # the empty-passage policy
        self._maybe_save(job.name, grader)
        train_scores = (grader.scores_from_states(train_states), self.train.labels)
        return scores, {"note": "next-token P(yes) vs P(no), read from the cached final states"}, train_scores

    def _head(self, job: Job) -> tuple[np.ndarray, dict]:
        train_states, test_states = self._final_states()
        grader = self._new(job)
        keep = [i for i, p in enumerate(self.train.passages) if p.strip()]
        bar, update = self._progress(job.name)
        with bar:
            result = grader.fit_states(train_states[keep], self.train.labels[keep], job.train, update)
        scores = grader.state_scores(test_states)
        scores[self._empty_test] = 0.0
        self._maybe_save(job.name, grader)
        return scores, {"train": result.summary()}, (grader.state_scores(train_states[keep]), self.train.labels[keep])

    def _lm(self, job: Job) -> tuple[np.ndarray, dict]:
        grader = self._new(job)
        bar, update = self._progress(job.name)
        with bar:
            result = grader.fit(self.train.queries, self.train.passages, self.train.labels, job.train, update)
        truncated_before = grader.stats.truncated_passages
        start = time.perf_counter()
        scores = grader.score_pairs(self.test.queries, self.test.passages)
        eval_seconds = time.perf_counter() - start
        self._maybe_save(job.name, grader)
        train_scores = None
        if self.cfg.select_precision is not None:  # a fixed sample of train pairs, the same for every config
            rng = np.random.default_rng(0)
            idx = [i for i in rng.permutation(len(self.train)) if self.train.passages[i].strip()]
            idx = idx[: self.cfg.threshold_pairs]
            train_scores = (grader.score_pairs([self.train.queries[i] for i in idx],
                                               [self.train.passages[i] for i in idx]), self.train.labels[idx])
        return scores, {
            "train": result.summary(), "eval_seconds": eval_seconds,
            "eval_pairs_per_s": len(scores) / max(eval_seconds, 1e-9),
            "test_truncated_passages": grader.stats.truncated_passages - truncated_before,
        }, train_scores

    def _maybe_save(self, name: str, grader) -> None:
        if name in self.cfg.save_models:
            grader.save(self.out_dir / "models" / name)


def _comparison(jobs: list[Job], results: dict[str, dict], field: str, names: list[str], values: list[str]) -> dict:
    """``{config: {value: headline metrics}}`` for one training field (``loss``, ``sampling``);
    the config itself stands for its own value, its twins ``<config>+<value>`` for the others."""
    own = {j.name: getattr(j.train, field) for j in jobs}
    return {
        name: {v: _headline(results[name if v == own[name] else f"{name}+{v}"]) for v in values} for name in names
    }


def _headline(metrics: dict) -> dict:
    return {k: metrics[k] for k in METRIC_KEYS}


def _target(cfg: GraderExperimentConfig, results: dict[str, dict], selection: dict | None = None) -> dict | None:
    """The target precision / recall checked on ``target_config`` or, with a selection, on the chosen
    default grader at its operating point."""
    name = (selection or {}).get("best_shippable") or cfg.target_config
    m = results.get(name)
    if m is None:
        return None
    from ragsieve.eval.stats import family_verdict, target_verdict

    if selection and "operating_point" in m:
        m = m["operating_point"]
    verdicts = {key: target_verdict(m[key], *(m.get(f"{key}_ci95") or (None, None)), target)
                for key, target in (("precision", cfg.target_precision), ("recall", cfg.target_recall))}
    return {
        "config": name, "precision": m["precision"], "recall": m["recall"],
        "precision_ci95": m.get("precision_ci95"), "recall_ci95": m.get("recall_ci95"),
        "precision_target": cfg.target_precision, "recall_target": cfg.target_recall,
        "met": m["precision"] >= cfg.target_precision and m["recall"] >= cfg.target_recall,
        "precision_gap": max(0.0, cfg.target_precision - m["precision"]),
        "recall_gap": max(0.0, cfg.target_recall - m["recall"]),
        # met only when both intervals clear their targets (ragsieve.eval.stats.target_verdict)
        "precision_verdict": verdicts["precision"], "recall_verdict": verdicts["recall"],
        "verdict": family_verdict(list(verdicts.values())),
    }


def _summary(cfg: GraderExperimentConfig, jobs: list[Job], results: dict[str, dict], selection: dict | None) -> dict:
    """The part of metrics.json that follows from the configs' results (a run's and a report's alike)."""
    return {
        "configs": results,
        "selection": selection,
        "loss_comparison": _comparison(jobs, results, "loss", cfg.loss_comparison, cfg.losses),
        "sampling_comparison": _comparison(jobs, results, "sampling", cfg.sampling_comparison, cfg.samplings),
        "lora_grid": [
            {"rank": j.lora_r, "alpha": j.lora_alpha, **_headline(results[j.name])}
            for j in jobs if j.name.startswith("lora_r")
        ],
        "target": _target(cfg, results, selection),
        "intervals": "95 % percentile bootstrap over whole test queries (each query's pairs resampled together)",
    }


def _test_record(pairs_file: Path, data_key: str) -> dict:
    """The test split of a run's ``pairs.jsonl`` as :meth:`_Split.record` keeps it (ids, query ids, labels),
    checked against the run's data key; read field by field, so a file without the text serves as well."""
    if not pairs_file.is_file():
        raise RagsieveError(f"neither {pairs_file.parent / TEST_PAIRS} nor {pairs_file} exists: "
                            "run the study to rebuild the pairs")
    rows = [json.loads(line) for line in pairs_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    key = hashlib.sha1(json.dumps([(r["id"], r["label"], r["split"]) for r in rows]).encode()).hexdigest()[:16]
    test = [r for r in rows if r["split"] == "test"]
    record = {"data_key": data_key, "ids": [r["id"] for r in test], "query_ids": [r["query_id"] for r in test],
              "labels": [int(r["label"]) for r in test],
              "empty_passages": [i for i, r in enumerate(test) if "passage" in r and not r["passage"].strip()]}
    if key != data_key:
        # pairs rebuilt since the run (retrieval ties can reorder a train query's pairs): usable only if its
        # test split is the run's, which rescore checks on every stored point estimate
        record["rebuilt_data_key"] = key
    return record


def _write_json(path: Path, data: dict) -> None:
    from ragsieve.atomic import write_json_atomic

    write_json_atomic(path, data, indent=2)  # a crash never leaves a half-written result to be trusted


def _print_table(console: Console, results: dict[str, dict], test: _Split) -> None:
    table = Table(title=f"graders on {len(test)} held-out pairs ({test.labels.mean():.1%} relevant)")
    for col in ("config", "accuracy", "precision", "recall", "F1", "AUROC", "seconds"):
        table.add_column(col, justify="right" if col != "config" else "left")
    for name, m in results.items():
        auroc = "n/a" if m.get("auroc") is None else f"{m['auroc']:.3f}"
        table.add_row(name, *(f"{m[k]:.3f}" for k in METRIC_KEYS), auroc, f"{m.get('seconds_total', 0):.0f}")
    console.print(table)
