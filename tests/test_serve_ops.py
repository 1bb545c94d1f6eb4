"""Running ``ragsieve serve`` in production (#63): scores that do not depend on their batch, fair scheduling
across requests, /metrics and /ready, start-up checks, graceful shutdown, errors in users' words."""

from __future__ import annotations

import random

import numpy as np
import pytest

WORDS = ("the river city king war music paris hamlet shakespeare wrote tragedy play moon landing 1972 apollo "
         "physics prize nobel einstein energy light speed planet orbit sun earth water ocean forest tree bird song "
         "history empire rome emperor battle army bridge tower church painting museum novel author poem").split()


def varied_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(query, document) pairs from a few queries, documents of 3 to 120 words (padded widths vary a lot)."""
    rng = random.Random(seed)
    queries = [" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) + "?" for _ in range(20)]
    return [(rng.choice(queries), " ".join(rng.choices(WORDS, k=rng.choice([rng.randint(3, 40),
                                                                             rng.randint(40, 120)]))))
            for _ in range(n)]


@pytest.mark.parametrize("bf16", ["1", "0"], ids=["bf16-cpu", "cpu-without-bf16"])
def test_the_default_reranker_scores_a_pair_the_same_in_any_batch(monkeypatch, bf16):
    """200 pairs scored alone and in 5 random batch compositions (as serve's worker mixes requests): the default
    reranker's backends with bf16 units (torch-bf16 + OpenVINO bf16) and without (torch fp32 + int8 ONNX)."""
    from ragsieve.models.cpu import fast_bf16
    from ragsieve.registry import load_reranker
    from ragsieve.rerank.chunks import window_reader

    monkeypatch.setenv("RAGSIEVE_CPU_BF16", bf16)
    fast_bf16.cache_clear()
    try:
        ranker = window_reader(load_reranker("embedded:base", whole_passages=False))
    finally:
        fast_bf16.cache_clear()
    pairs = varied_pairs(200)

    def score(group):
        return ranker.score_pairs([q for q, _ in group], [d for _, d in group])

    alone = np.array([score([pair])[0] for pair in pairs])
    rng = random.Random(1)
    for _ in range(5):
        order = list(range(len(pairs)))
        rng.shuffle(order)
        batched, lo = np.zeros(len(pairs)), 0
        while lo < len(order):
            idx = order[lo: lo + rng.randint(1, 64)]
            batched[idx] = score([pairs[i] for i in idx])
            lo += len(idx)
        assert np.abs(batched - alone).max() <= 1e-4
