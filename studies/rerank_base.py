"""``ragsieve run experiments/rerank_base.yaml``: mine, train, ship and evaluate ``embedded:base``.

Phases, each resumable after a kill (work files under ``<out_dir>/work/``, git-ignored):

1. **mine** — gold groups + BM25/MiniLM hard negatives per dataset (:mod:`ragsieve.benchmarks.mining`).
2. **train** — InfoNCE on gold + listwise distillation of MiniLM cosine, early stopping on dev
   (:mod:`ragsieve.rerank.training.distill`); checkpoints every ``eval_steps``.
3. **ship** — fp16 safetensors + int8 ONNX + card into ``ragsieve/assets/base-reranker``
   (only with ``ship: true``), calibration fitted on the dev groups.
4. **evaluate** — held-out MRR@10 / nDCG@10 per dataset for BM25, MiniLM cosine, the new model
   in fp32 and on the ONNX int8 path, with 95 % bootstrap intervals and paired bootstrap
   differences against cosine → ``metrics.json``; the default backend is the fastest
   whose nDCG@10 stays within ``backend_tolerance`` of fp32 on every dataset.

Example::

"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np
from pydantic import Field
from rich.console import Console

from ragsieve.artifacts import weights_key
from ragsieve.config import StrictConfig
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.rerank.training.distill import DistillConfig
from ragsieve.benchmarks.mining import SOURCES, MiningConfig
from ragsieve.benchmarks.relevance import per_query

log = logging.getLogger(__name__)


def _recipe_distill() -> DistillConfig:
    return DistillConfig(time_budget_minutes=35, eval_steps=75)


class RerankBaseStudyConfig(StrictConfig):
    mining: MiningConfig = Field(default_factory=MiningConfig)
    distill: DistillConfig = Field(default_factory=_recipe_distill)
    train_per_dataset: int = 200  # mined train questions used per dataset (dev rows all used)
    datasets: list[str] = list(SOURCES)
    ship: bool = True  # write the trained model into the package's asset folder
    asset_dir: str = ""  # "" = ragsieve/assets/base-reranker
    backend_tolerance: float = 0.005  # max nDCG@10 loss of the default backend vs fp32, per dataset
    # fp32 is scored only on the first n held-out queries per dataset (for the backend check):
    # a full fp32 pass costs ~10 min on a shared 2-core machine
    fp32_queries: int = 30
    bootstrap: int = 2000
    ks: list[int] = [1, 3, 5, 10]
    encoder: str = DEFAULT_ENCODER
    data_dir: str | None = None
    seed: int = 0


def load_mined(cfg: RerankBaseStudyConfig, work: Path) -> tuple[list[dict], list[dict]]:
    """(train rows capped per dataset, dev rows) from the mined files."""
    from ragsieve.benchmarks.mining import read_mined

    train, dev = [], []
    for name in cfg.datasets:
        rows = read_mined(work / "mined" / f"{name}.jsonl")
        train += [r for r in rows if r["split"] == "train"][: cfg.train_per_dataset]
        dev += [r for r in rows if r["split"] == "dev"]
    return train, dev


def dev_pairs(dev: Sequence[dict]) -> tuple[list[str], list[str], list[int]]:
    """(queries, passages, labels) of every dev group: the calibration set."""
    qs, ps, ys = [], [], []
    for m in dev:
        for _, text, *_ in m["pos"]:
            qs.append(m["query"]); ps.append(text); ys.append(1)
        for _, text, *_ in m["neg"]:
            qs.append(m["query"]); ps.append(text); ys.append(0)
    return qs, ps, ys


def bootstrap_ci(values: np.ndarray, n: int, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of the mean (queries resampled with replacement)."""
    from scipy.stats import bootstrap

    res = bootstrap((values,), np.mean, n_resamples=n, method="percentile", random_state=seed)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def paired_diff(a: np.ndarray, b: np.ndarray, n: int, seed: int = 0) -> dict[str, float]:
    """Mean of a - b per query with its 95 % paired bootstrap interval."""
    d = a - b
    lo, hi = bootstrap_ci(d, n, seed) if np.any(d != d[0]) else (float(d[0]), float(d[0]))
    return {"diff": float(d.mean()), "low": lo, "high": hi}


class _Memo:
    """Scores of a ranker remembered per (query, passage texts): the mixed and the
    cross-encoder-only rows share one cross-encoder pass."""

    def __init__(self, ranker) -> None:
        self.ranker = ranker
        self.score_is_probability = ranker.score_is_probability
        self.memo: dict = {}

    def score(self, query, passages):
        key = (query, tuple(p.full_text for p in passages))
        if key not in self.memo:
            self.memo[key] = self.ranker.score(query, passages)
        return self.memo[key]


class CosineOverCandidates:
    """MiniLM cosine (as ``BiEncoderRanker``) with every candidate and query encoded once, in one
    length-sorted batch call: per-query calls pad each small batch and re-encode repeats."""

    name = "cosine"

    def __init__(self, encoder: str, queries, backend: str = "torch") -> None:
        self.encoder, self.queries, self.backend = encoder, queries, backend
        self._vec: dict | None = None

    @property
    def vec(self) -> dict:
        # encoded on first use: a study whose cosine scores are all recorded never loads MiniLM
        if self._vec is None:
            from ragsieve.rerank.neural import BiEncoderRanker

            qs = self.queries
            texts = sorted({p.full_text for q in qs for p in q.candidates} | {q.query for q in qs})
            # the shipped cosine's own encoding: backend, batch size (int8 quantises per batch) and autocast
            self._vec = dict(zip(texts, BiEncoderRanker(self.encoder, backend=self.backend).embed(texts)))
        return self._vec

    score_is_probability = False

    def score(self, query: str, passages) -> np.ndarray:
        vec = self.vec
        return np.array([float(vec[p.full_text] @ vec[query]) for p in passages])

    def rank(self, query: str, passages):
        from ragsieve.rerank.base import BaseRanker

        outer = self

        class _Scored(BaseRanker):
            def score(self, q, items):
                return outer.score(q, items)

        return _Scored().rank(query, passages)


class RerankBaseStudy:
    Config = RerankBaseStudyConfig

    def run(self, cfg: RerankBaseStudyConfig, out_dir: Path, console: Console) -> dict:
        from ragsieve.benchmarks.mining import mine_all

        work = Path(out_dir) / "work"
        t0 = time.perf_counter()
        counts = mine_all(cfg.mining, work / "mined", cfg.data_dir, cfg.datasets)
        console.print(f"mined rows: {counts}")
        final = self.train(cfg, work, console)
        from ragsieve.rerank.shipped import ASSET_DIR

        target = Path(cfg.asset_dir) if cfg.asset_dir else ASSET_DIR
        # a candidate folder first: the shipped asset is replaced only by a model measured better
        candidate = self.ship(cfg, final, work, work / "asset-candidate", console)
        key = weights_key(final)  # a new model never reuses another model's cached scores
        result = self.evaluate(cfg, final, candidate, console, work / "eval" / key)
        result["mined_rows"] = counts
        result["training"] = _trainer_state(work / "model")
        result["seconds"] = time.perf_counter() - t0
        self._record_backend(candidate, result)
        old = _mean_model_mrr(target)
        new = float(np.mean([rows["model-onnx-int8"]["MRR@10"]["mean"] for rows in result["by_dataset"].values()]))
        result["shipped"] = cfg.ship and (old is None or new > old)
        if result["shipped"]:
            import shutil

            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(candidate, target)
        console.print(f"held-out mean MRR@10 {new:.4f} vs shipped {old}: {'shipped' if result['shipped'] else 'kept'}")
        (Path(out_dir) / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
        return result

    @staticmethod
    def train(cfg: RerankBaseStudyConfig, work: Path, console: Console) -> Path:
        from ragsieve.rerank.training.distill import train_distilled

        final = work / "model" / "final"
        if (final / "config.json").exists():
            return final
        train, dev = load_mined(cfg, work)
        console.print(f"training on {len(train)} questions × {cfg.distill.passes} passes, dev {len(dev)}")
        t = time.perf_counter()
        train_distilled(train, dev, cfg.distill, work / "model")
        (work / "model" / "train_seconds.txt").write_text(f"{time.perf_counter() - t:.0f}\n")
        return final

    @staticmethod
    def ship(cfg: RerankBaseStudyConfig, final: Path, work: Path, asset: Path | None, console: Console) -> Path:
        from ragsieve.rerank.calibration import Calibration
        from ragsieve.rerank.shipped import ASSET_DIR, OnnxCrossEncoderRanker, write_asset

        asset = asset or ASSET_DIR
        state = _trainer_state(work / "model")
        card = {
            "recipe": {"experiment": "rerank_base", "params": cfg.model_dump(exclude={"asset_dir", "data_dir"})},
            "max_length": cfg.distill.max_length,
            "default_backend": "onnx-int8",  # confirmed (or replaced) by the evaluation
            "training": state,
        }
        write_asset(final, asset, card)
        _, dev = load_mined(cfg, work)
        ranker = OnnxCrossEncoderRanker(asset, max_length=cfg.distill.max_length)
        # dev groups: cross-encoder logits next to the mined MiniLM cosines of the same docs
        logits, cosines, rel = [], [], []
        for m in dev:
            docs = m["pos"] + m["neg"]
            logits.append(ranker.predict_pairs([(m["query"], d[1]) for d in docs]))
            cosines.append(np.array([d[2] for d in docs]))
            rel.append(np.array([1] * len(m["pos"]) + [0] * len(m["neg"])))
        from ragsieve.rerank.mixed import tune_cosine_weight

        weight, by_w = tune_cosine_weight(logits, cosines, rel, scale=cfg.distill.teacher_scale)
        mixed = np.concatenate([lg + weight * cfg.distill.teacher_scale * cs for lg, cs in zip(logits, cosines)])
        ys = np.concatenate(rel)
        cal = Calibration.fit(mixed, ys)
        card["cosine_weight"] = weight
        card["cosine_scale"] = cfg.distill.teacher_scale
        card["dev_ndcg10_by_cosine_weight"] = by_w
        card["calibration"] = {"temperature": cal.temperature, "bias": cal.bias, "fitted_on": f"{len(ys)} dev pairs "
                               f"({int(ys.sum())} relevant) of {len(dev)} dev questions, on the mixed logit"}
        from ragsieve.rerank.shipped import CARD

        (asset / CARD).write_text(json.dumps(card, indent=2) + "\n")
        console.print(f"shipped {asset} (cosine weight {weight}, calibration T={cal.temperature:.3f}, b={cal.bias:.3f})")
        return asset

    @staticmethod
    def evaluate(cfg: RerankBaseStudyConfig, final: Path, asset: Path | None, console: Console,
                 cache: Path | None = None) -> dict:
        """Per-dataset metrics; per-query scores cached in ``cache/<dataset>.json`` so a killed run resumes."""
        from ragsieve.data import load_dataset
        from ragsieve.rerank.lexical import BM25Ranker
        from ragsieve.benchmarks.mining import held_out_sources
        from ragsieve.rerank.neural import CrossEncoderRanker
        from ragsieve.benchmarks.relevance import ranking_queries, split_questions
        from ragsieve.rerank.shipped import OnnxCrossEncoderRanker

        from ragsieve.rerank.mixed import CosineMixRanker
        from ragsieve.rerank.shipped import read_card

        ml = cfg.distill.max_length
        weight = float(read_card(asset).get("cosine_weight", 0.0)) if asset else 0.0
        scale = cfg.distill.teacher_scale
        fp32 = _Memo(CrossEncoderRanker(str(final), max_length=ml))
        int8 = _Memo(OnnxCrossEncoderRanker(asset, max_length=ml)) if asset else None
        sources = held_out_sources()
        out: dict = {"by_dataset": {}, "sizes": {}}
        for name in cfg.datasets:
            ds = load_dataset(name, data_dir=cfg.data_dir)
            _, test = split_questions(ds, sources[name], cfg.seed)
            queries = ranking_queries(ds, test, sources[name])
            out["sizes"][name] = {
                "queries": len(queries),
                "mean_candidates": float(np.mean([len(q.candidates) for q in queries])),
                "with_relevant_candidate": sum(bool(q.relevant & {p.id for p in q.candidates}) for q in queries),
            }
            cached = cache / f"{name}.json" if cache else None
            if cached and cached.exists():
                per = json.loads(cached.read_text())
            else:
                cosine = CosineOverCandidates(cfg.encoder, queries)
                # "model" = what embedded:base ships (int8 cross-encoder + weighted cosine)
                rankers = {"bm25": BM25Ranker(), "cosine": cosine,
                           "model-fp32": CosineMixRanker(fp32, weight, scale, cosine=cosine),
                           "ce-only-fp32": CosineMixRanker(fp32, 0.0, scale, cosine=cosine)}
                if int8:
                    rankers["model-onnx-int8"] = CosineMixRanker(int8, weight, scale, cosine=cosine)
                    rankers["ce-only-onnx-int8"] = CosineMixRanker(int8, 0.0, scale, cosine=cosine)
                per = {r: per_query(ranker, queries[: cfg.fp32_queries] if r.endswith("fp32") else queries)
                       for r, ranker in rankers.items()}
                if cached:
                    cached.parent.mkdir(parents=True, exist_ok=True)
                    cached.write_text(json.dumps(per))
            rows = {}
            for r, m in per.items():
                rows[r] = {"n": len(m["MRR@10"])}
                for metric in ("MRR@10", "nDCG@10"):
                    qids = list(m[metric])
                    v = np.array([m[metric][q] for q in qids])
                    lo, hi = bootstrap_ci(v, cfg.bootstrap, cfg.seed)
                    rows[r][metric] = {"mean": float(v.mean()), "low": lo, "high": hi}
                    if r != "cosine":  # paired over the same queries
                        c = np.array([per["cosine"][metric][q] for q in qids])
                        rows[r][metric]["vs_cosine"] = paired_diff(v, c, cfg.bootstrap, cfg.seed)
            if "model-onnx-int8" in per:  # the backend check, on the queries fp32 scored
                fp = per["model-fp32"]["nDCG@10"]
                rows["model-onnx-int8"]["ndcg10_minus_fp32_same_queries"] = float(
                    np.mean([per["model-onnx-int8"]["nDCG@10"][q] - fp[q] for q in fp]))
            out["by_dataset"][name] = rows
            console.print(name, {r: round(rows[r]["MRR@10"]["mean"], 3) for r in rows})
        return out

    @staticmethod
    def _record_backend(asset: Path, result: dict) -> None:
        """Keep ONNX int8 as the default only if it is within tolerance of fp32 on every dataset."""
        from ragsieve.rerank.shipped import CARD

        card = json.loads((asset / CARD).read_text())
        tol = card["recipe"]["params"]["backend_tolerance"]
        gaps = {n: -rows["model-onnx-int8"]["ndcg10_minus_fp32_same_queries"]
                for n, rows in result["by_dataset"].items()}
        card["default_backend"] = "onnx-int8" if max(gaps.values()) <= tol else "torch"
        card["backend_ndcg10_gap_vs_fp32"] = gaps
        card["heldout_mrr10"] = {n: {r: round(v["MRR@10"]["mean"], 4) for r, v in rows.items()}
                                 for n, rows in result["by_dataset"].items()}
        (asset / CARD).write_text(json.dumps(card, indent=2) + "\n")


def _mean_model_mrr(asset: Path) -> float | None:
    """Mean held-out MRR@10 recorded in a shipped card (None if nothing is shipped)."""
    from ragsieve.rerank.shipped import CARD

    path = asset / CARD
    if not path.exists():
        return None
    by = json.loads(path.read_text()).get("heldout_mrr10", {})
    vals = [v["model-onnx-int8"] for v in by.values() if "model-onnx-int8" in v]
    return float(np.mean(vals)) if vals else None


def _trainer_state(model_dir: Path) -> dict:
    """Steps, best dev checkpoint and dev history from the trainer's last checkpoint."""
    states = sorted(model_dir.glob("checkpoints/checkpoint-*/trainer_state.json"),
                    key=lambda p: int(p.parent.name.split("-")[1]))
    if not states:
        return {}
    s = json.loads(states[-1].read_text())
    dev = [{k: h[k] for k in ("step", "eval_dev_ndcg@10", "eval_dev_mrr@10", "eval_dev_base_ndcg@10") if k in h}
           for h in s["log_history"] if "eval_dev_ndcg@10" in h]
    seconds = model_dir / "train_seconds.txt"
    return {"global_step": s["global_step"], "best_checkpoint": Path(s.get("best_model_checkpoint") or "").name,
            "best_dev_ndcg10": s.get("best_metric"), "dev_history": dev,
            "train_seconds": float(seconds.read_text()) if seconds.exists() else None}


def markdown_table(result: dict, target: float = 0.02) -> str:
    """Held-out table: mean [95 % CI] per ranker, the model's paired difference to cosine, and the verdict on
    the target (model − cosine ≥ ``target``) in the one vocabulary of :func:`ragsieve.eval.stats.target_verdict`."""
    from ragsieve.eval.stats import target_verdict

    lines = ["| dataset (n) | BM25 MRR@10 | cosine MRR@10 | model MRR@10 | model − cosine MRR@10 [95 % CI] "
             "| nDCG@10 BM25 / cosine / model | model − cosine nDCG@10 [95 % CI] "
             f"| model − cosine ≥ +{target} MRR@10 |",
             "|---|---|---|---|---|---|---|---|"]
    model = "model-onnx-int8"
    for name, rows in result["by_dataset"].items():
        m = rows.get(model) or rows["model-fp32"]

        def cell(r, metric):
            v = rows[r][metric]
            return f"{v['mean']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"

        def diff(metric):
            d = m[metric]["vs_cosine"]
            return f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"

        d = m["MRR@10"]["vs_cosine"]
        verdict = target_verdict(d["diff"], d["low"], d["high"], target)
        nd = " / ".join(f"{rows[r]['nDCG@10']['mean']:.3f}" for r in ("bm25", "cosine")) + f" / {m['nDCG@10']['mean']:.3f}"
        lines.append(f"| {name} ({m['n']}) | {cell('bm25', 'MRR@10')} | {cell('cosine', 'MRR@10')} | "
                     f"{m['MRR@10']['mean']:.3f} [{m['MRR@10']['low']:.3f}, {m['MRR@10']['high']:.3f}] | "
                     f"{diff('MRR@10')} | {nd} | {diff('nDCG@10')} | {verdict} |")
    return "\n".join(lines)
