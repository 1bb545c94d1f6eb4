"""The reranker contract, in the style of AnswerDotAI ``rerankers``.

Every reranker implements :meth:`BaseRanker.score` over (query, passages) and gets
``rank()`` / ``top_k()`` for free, returning typed results that keep each passage's
original index (duplicates included), so callers can map back to their own lists.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError


@dataclass(frozen=True)
class RankedResult:
    passage: Passage
    score: float
    rank: int  # 0-based position after reranking
    index: int  # position in the input list


@dataclass(frozen=True)
class RankedResults:
    query: str
    results: tuple[RankedResult, ...]

    def top_k(self, k: int) -> list[RankedResult]:
        if k < 1:
            raise RagsieveError(f"k must be >= 1, got {k}")
        return list(self.results[:k])

    def passages(self) -> list[Passage]:
        return [r.passage for r in self.results]

    def __len__(self) -> int:
        return len(self.results)


def as_passages(passages: Sequence[Passage | str]) -> list[Passage]:
    """Accept plain strings too; they get ids ``"0"``, ``"1"``, ... by position."""
    out = []
    for i, p in enumerate(passages):
        if isinstance(p, Passage):
            out.append(p)
        elif isinstance(p, str):
            out.append(Passage(str(i), p))
        else:
            raise RagsieveError(f"passage {i} is a {type(p).__name__}, expected Passage or str")
    return out


class BaseRanker(ABC):
    """Scores (query, passage) pairs; higher is more useful.

    Example::

        ranker = load_reranker("bm25")
        ranker.rank("who wrote hamlet", ["Hamlet is by Shakespeare.", "Paris"]).top_k(1)
    """

    name: str = "base"

    @abstractmethod
    def score(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        """One score per passage, in input order."""

    def rank(self, query: str, passages: Sequence[Passage | str]) -> RankedResults:
        if not isinstance(query, str) or not query.strip():
            raise RagsieveError("empty query")
        items = as_passages(passages)
        if not items:
            return RankedResults(query, ())
        scores = np.asarray(self.score(query, items), dtype=float)
        if scores.shape != (len(items),):
            raise RagsieveError(f"{self.name} returned {scores.shape} scores for {len(items)} passages")
        # Stable sort on -score: equal scores keep input order, so results are reproducible.
        order = np.argsort(-scores, kind="stable")
        return RankedResults(
            query, tuple(RankedResult(items[i], float(scores[i]), r, int(i)) for r, i in enumerate(order))
        )

    def top_k(self, query: str, passages: Sequence[Passage | str], k: int) -> list[RankedResult]:
        return self.rank(query, passages).top_k(k)


class RetrievalOrder(BaseRanker):
    """No reranking: keeps the retriever's order (the "retriever only" row, ``load_reranker("none")``)."""

    name = "retriever"

    def score(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        return -np.arange(len(passages), dtype=float)
