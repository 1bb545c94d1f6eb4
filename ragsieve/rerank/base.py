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
    #: True when ``score`` returns sigmoid outputs (calibration then fits on their logits)
    score_is_probability: bool = False
    #: set by :meth:`calibrate` (or shipped with a model); see :mod:`ragsieve.rerank.calibration`
    calibration = None

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

    def calibrate(self, queries: Sequence[str], passages: Sequence[Passage | str], labels: Sequence[int]):
        """Fit ``predict_proba``'s temperature and bias on labelled (query, passage) pairs (e.g. a dev split).

        Example::

            ranker.calibrate(["q1", "q1"], ["relevant text", "other text"], [1, 0]).temperature
        """
        from ragsieve.rerank.calibration import Calibration

        if not (len(queries) == len(passages) == len(labels)):
            raise RagsieveError("calibrate needs one query and one label per passage")
        items = as_passages(passages)
        scores = np.empty(len(items))
        by_query: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            by_query.setdefault(q, []).append(i)
        for q, idx in by_query.items():  # one score call per query keeps batching
            scores[idx] = self.score(q, [items[i] for i in idx])
        self.calibration = Calibration.fit(scores, labels, from_probability=self.score_is_probability)
        return self.calibration

    def predict_proba(self, query: str, passages: Sequence[Passage | str]) -> np.ndarray:
        """Calibrated probability that each passage is relevant, in input order (needs a calibration)."""
        if self.calibration is None:
            raise RagsieveError(f"{self.name} is not calibrated: call calibrate() on labelled dev pairs first")
        items = as_passages(passages)
        return self.calibration.proba(self.score(query, items)) if items else np.zeros(0)
