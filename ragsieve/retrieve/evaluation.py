"""Retriever comparison on held-out questions with known gold passages (``ragsieve eval-retrieval``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from ragsieve.errors import RagsieveError


def evaluate_retrievers(
    dataset: str,
    *,
    kinds: Sequence[str] = ("bm25", "dense", "hybrid"),
    ks: Sequence[int] = (1, 5, 10, 20),
    n_questions: int = 500,
    encoder_spec: str | None = None,
    data_dir: str | Path | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
) -> dict:
    """Recall@k and MRR@10 of each retriever kind over the dataset's pool.

    Held-out questions are the ``test`` split by id (the same split the demo uses).
    Indexes are built in memory; the dense embeddings are computed once and shared
    by the dense and hybrid retrievers.

    Example::

        evaluate_retrievers("nq-oracle", kinds=["bm25", "hybrid"], n_questions=100)["metrics"]["hybrid"]["R@10"]
    """
    from ragsieve.data import held_out_questions, load_dataset
    from ragsieve.eval.ranking import ranking_metrics
    from ragsieve.models.specs import DEFAULT_ENCODER
    from ragsieve.retrieve.bm25 import BM25Retriever
    from ragsieve.retrieve.dense import DenseRetriever
    from ragsieve.retrieve.hybrid import HybridRetriever

    ds = load_dataset(dataset, data_dir=data_dir)
    qrels_all = ds.qrels()
    if not ds.passages or not qrels_all:
        raise RagsieveError(f"dataset '{dataset}' has no passage pool with gold judgments to evaluate against")
    questions = [q for q in held_out_questions(ds.questions, test_fraction, seed) if q.id in qrels_all]
    if n_questions:
        questions = questions[:n_questions]
    qrels = {q.id: qrels_all[q.id] for q in questions}
    depth = max(max(ks), 10)

    builders = {
        "bm25": lambda: BM25Retriever.build(ds.passages),
        "dense": lambda: dense,
        "hybrid": lambda: HybridRetriever(BM25Retriever.build(ds.passages), dense),
    }
    unknown = sorted(set(kinds) - set(builders))
    if unknown:
        raise RagsieveError(f"unknown retriever kind(s) {unknown}; choose from {sorted(builders)}")
    dense = (
        DenseRetriever.build(ds.passages, encoder_spec=encoder_spec or DEFAULT_ENCODER)
        if {"dense", "hybrid"} & set(kinds)
        else None
    )

    metrics, timings = {}, {}
    for kind in kinds:
        retriever = builders[kind]()
        start = time.perf_counter()
        hits = retriever.search_batch([q.text for q in questions], k=depth)
        timings[kind] = (time.perf_counter() - start) / max(len(questions), 1)
        run = {q.id: {h.passage.id: float(depth - h.rank) for h in row} for q, row in zip(questions, hits)}
        m = ranking_metrics(qrels, run, ks=ks, measures=("R",))
        m.update(ranking_metrics(qrels, run, ks=(10,), measures=("MRR",)))
        metrics[kind] = m
    return {
        "dataset": dataset,
        "n_questions": len(questions),
        "n_passages": len(ds.passages),
        "metrics": metrics,
        "seconds_per_query": timings,
    }
