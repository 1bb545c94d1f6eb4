"""Forgetting: how much general relevance a fine-tuned reranker lost, measured on gold sets.

Aligning the base reranker to an LLM's confidence shifts can cost the relevance ranking it
started with (issue #18). This module scores rankers on the held-out gold relevance sets of
the six bundled datasets — exactly the sets the base reranker's report uses
(:func:`~ragsieve.benchmarks.mining.held_out_sources`, :func:`~ragsieve.benchmarks.relevance.split_questions`,
:func:`~ragsieve.benchmarks.relevance.ranking_queries`; the first ``max_queries`` of each) — and
reports per dataset and ranker n, MRR@10 and nDCG@10 with 95 % bootstrap intervals, and each
ranker's paired difference to a named reference (the reranker it started from), with its
paired bootstrap interval and verdict (:mod:`ragsieve.eval.stats`).

Per-query values are cached as JSON per (dataset, ranker key), so a killed run resumes and a
reference scored once is never scored again. The key must change when the weights do: use
:func:`~ragsieve.rerank.shipped.weights_key` for a model folder.

Example::

    from ragsieve.benchmarks.forgetting import measure_forgetting
    from ragsieve.rerank.shipped import weights_key
    from ragsieve.rerank.neural import CrossEncoderRanker

    result = measure_forgetting(
        {"base": lambda: CrossEncoderRanker("ragsieve/assets/base-reranker", max_length=256),
         "aligned": lambda: CrossEncoderRanker("models/aligned", max_length=256)},
        reference="base", max_queries=100, cache_dir="work/forgetting",
        keys={"base": weights_key("ragsieve/assets/base-reranker"), "aligned": weights_key("models/aligned")})
    result["datasets"]["fever"]["rankers"]["aligned"]["vs_reference"]["MRR@10"]   # diff, low, high, p, verdict
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Union

import numpy as np

from ragsieve.errors import RagsieveError
from ragsieve.rerank.base import BaseRanker
from ragsieve.benchmarks.mining import SOURCES, held_out_sources
from ragsieve.benchmarks.relevance import RankingQuery, per_query, ranking_queries, split_questions

log = logging.getLogger(__name__)

#: the metrics of the base reranker's report, per query
METRICS = ("MRR@10", "nDCG@10")

#: a ranker, or a zero-argument function that builds one (called only when some dataset is not cached)
RankerLike = Union[BaseRanker, Callable[[], BaseRanker]]


def heldout_queries(name: str, data_dir: str | Path | None = None, seed: int = 0,
                    max_queries: int | None = None) -> list[RankingQuery]:
    """Held-out ranking queries of dataset ``name``, the base reranker report's (the first ``max_queries``)."""
    from ragsieve.data import load_dataset

    sources = held_out_sources()
    if name not in sources:
        raise RagsieveError(f"no held-out relevance set for '{name}'; known: {', '.join(SOURCES)}")
    ds = load_dataset(name, data_dir=data_dir)
    _, test = split_questions(ds, sources[name], seed)
    queries = ranking_queries(ds, test, sources[name])
    return queries[:max_queries] if max_queries else queries


def measure_forgetting(
    rankers: Mapping[str, RankerLike],
    reference: str,
    *,
    datasets: Sequence[str] = SOURCES,
    max_queries: int | None = 100,
    cache_dir: str | Path | None = None,
    keys: Mapping[str, str] | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    data_dir: str | Path | None = None,
) -> dict:
    """Held-out MRR@10 / nDCG@10 of every ranker per dataset, and each one's paired difference to ``reference``.

    ``rankers`` maps a name to a ranker or a function building one; ``keys`` maps a name to
    the cache key of its weights (default: the name itself, fine for BM25 or cosine).
    Returns ``{"reference", "max_queries", "datasets": {name: {"n", "rankers": {ranker:
    {"n", "MRR@10": {"mean", "low", "high"}, "nDCG@10": {...}, "vs_reference": {"MRR@10":
    {n, a, b, diff, low, high, p_value, verdict}, ...}}}}}}`` (no ``vs_reference`` for the
    reference itself).

    Example::

        measure_forgetting({"bm25": BM25Ranker(), "none": RetrievalOrder()}, "bm25",
                           datasets=["fever"], max_queries=3)["datasets"]["fever"]["rankers"]["none"]
    """
    from ragsieve.eval.stats import bootstrap_ci, paired_bootstrap

    if reference not in rankers:
        raise RagsieveError(f"reference '{reference}' is not one of the rankers: {', '.join(rankers)}")
    unknown = [d for d in datasets if d not in held_out_sources()]
    if unknown:
        raise RagsieveError(f"no held-out relevance set for {unknown}; known: {', '.join(SOURCES)}")
    keys = dict(keys or {})
    built: dict[str, BaseRanker] = {}

    def ranker(name: str) -> BaseRanker:
        if name not in built:
            r = rankers[name]
            built[name] = r if isinstance(r, BaseRanker) else r()
        return built[name]

    out: dict = {"reference": reference, "max_queries": max_queries, "metrics": list(METRICS), "datasets": {}}
    for name in datasets:
        queries = heldout_queries(name, data_dir, seed, max_queries)
        if not queries:
            raise RagsieveError(f"{name}: no held-out ranking queries")
        qids = [q.query_id for q in queries]
        per: dict[str, dict[str, dict[str, float]]] = {}
        for r in rankers:
            cached = Path(cache_dir) / f"{name}.{keys.get(r, r)}.json" if cache_dir else None
            per[r] = _cached(cached, qids)
            if per[r] is None:
                log.info("forgetting: scoring %s on %d %s queries", r, len(queries), name)
                per[r] = per_query(ranker(r), queries, ks=(10,), measures=("MRR", "nDCG"))
                if cached:
                    _write(cached, per[r])
        rows = {}
        for r, m in per.items():
            rows[r] = {"n": len(qids)}
            for metric in METRICS:
                v = np.array([m[metric][q] for q in qids])
                est, lo, hi = bootstrap_ci(v, n_boot=n_boot, seed=seed)
                rows[r][metric] = {"mean": est, "low": lo, "high": hi}
            if r != reference:
                rows[r]["vs_reference"] = {
                    metric: paired_bootstrap([m[metric][q] for q in qids], [per[reference][metric][q] for q in qids],
                                             n_boot=n_boot, seed=seed).to_dict()
                    for metric in METRICS}
        out["datasets"][name] = {"n": len(qids), "rankers": rows}
    return out


def _cached(path: Path | None, qids: Sequence[str]) -> dict | None:
    """The cached per-query values for exactly these queries, or None (missing, damaged or other queries)."""
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return {metric: {q: float(data[metric][q]) for q in qids} for metric in METRICS}
    except (ValueError, KeyError, TypeError):
        return None  # a cache for fewer queries, or a damaged file: score again


def _write(path: Path, per: dict) -> None:
    from ragsieve.atomic import atomic_file

    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(per) + "\n")
