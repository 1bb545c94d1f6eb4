"""BM25 over the candidate list itself (IDF from the candidates, as a reranking baseline)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.rerank.base import BaseRanker


class BM25Ranker(BaseRanker):
    """Okapi BM25 (``rank_bm25``-style scoring via bm25s) computed over the given passages.

    Example::

        BM25Ranker().rank("hamlet author", ["Hamlet is by Shakespeare.", "Paris"]).results[0].index  # 0
    """

    name = "bm25"
    pointwise = False  # IDF comes from the candidate list itself

    def __init__(self, k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b

    def score(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        from ragsieve.retrieve.bm25 import BM25Retriever

        # Candidate ids may repeat (duplicates are legal input); index by position.
        indexed = [Passage(str(i), p.text, p.title) for i, p in enumerate(passages)]
        return np.asarray(BM25Retriever.build(indexed, k1=self.k1, b=self.b).scores(query), dtype=float)
