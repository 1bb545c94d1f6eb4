"""``rerank_base``: the base cross-encoder (``embedded:base``) vs BM25 and MiniLM cosine on
held-out questions of each gold relevance source."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from pydantic import Field
from rich.console import Console

from ragsieve.config import StrictConfig
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.rerank.embedded import BaseRerankerConfig
from ragsieve.studies.common import baseline_rankers, metrics_table


# --- rerank_base ------------------------------------------------------------------------------


class RerankBaseConfig(StrictConfig):
    base: BaseRerankerConfig = Field(default_factory=BaseRerankerConfig)
    ks: list[int] = [1, 3, 5, 10]
    encoder: str = DEFAULT_ENCODER
    data_dir: str | None = None


class RerankBaseExperiment:
    """Train (once, cached) and evaluate ``embedded:base`` per dataset."""

    Config = RerankBaseConfig

    def run(self, cfg: RerankBaseConfig, out_dir: Path, console: Console) -> dict:
        from ragsieve.data import load_dataset
        from ragsieve.rerank.embedded import CARD_FILE, ensure_base_reranker
        from ragsieve.rerank.neural import CrossEncoderRanker
        from ragsieve.rerank.relevance import evaluate_rankers, ranking_queries, split_questions

        t0 = time.perf_counter()
        model_dir = ensure_base_reranker(cfg.base, cfg.data_dir)
        train_seconds = time.perf_counter() - t0
        rankers = {**baseline_rankers(cfg.encoder), "base": CrossEncoderRanker(str(model_dir))}
        by_dataset, sizes = {}, {}
        for name, source in cfg.base.sources.items():
            ds = load_dataset(name, data_dir=cfg.data_dir)
            _, test = split_questions(ds, source, cfg.base.seed)
            queries = ranking_queries(ds, test, source)
            sizes[name] = {
                "queries": len(queries),
                "mean_candidates": float(np.mean([len(q.candidates) for q in queries])),
                "queries_with_relevant_candidate": sum(bool(q.relevant & {p.id for p in q.candidates}) for q in queries),
            }
            by_dataset[name] = evaluate_rankers(rankers, queries, ks=cfg.ks)
            console.print(metrics_table(f"{name}: {len(queries)} held-out queries", by_dataset[name],
                                        ["MRR@10", "nDCG@10", "P@1"]))
        result = {
            "by_dataset": by_dataset,
            "eval_sizes": sizes,
            "training": json.loads((model_dir / CARD_FILE).read_text()),
            "model_dir": str(model_dir),
            "seconds": time.perf_counter() - t0,
            "train_or_load_seconds": train_seconds,
        }
        (out_dir / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
        return result


