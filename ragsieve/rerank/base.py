"""The one pair-scoring contract, in the style of AnswerDotAI ``rerankers``.

Everything in ragsieve that scores a (query, passage) pair is a :class:`BaseRanker`:
lexical and neural rerankers, the pointwise LLM reranker, every relevance grader (a
grader is a ranker plus a threshold) and the evolving reranker's judges. A ranker
implements :meth:`BaseRanker.score` (one query, its passages) or
:meth:`BaseRanker.score_pairs` (aligned pairs across queries, the batched form graders
and evaluation use), whichever is natural, and gets the other plus ``rank()`` /
``top_k()`` for free. Results are typed and keep each passage's original index
(duplicates included), so callers can map back to their own lists.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from typing import Any, Sequence

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


def ranked_from_scores(query: str, passages: Sequence[Passage], scores: Sequence[float]) -> RankedResults:
    """Typed results from one score per passage; equal scores keep input order (reproducible)."""
    scores = np.asarray(scores, dtype=float)
    order = np.argsort(-scores, kind="stable")
    return RankedResults(
        query, tuple(RankedResult(passages[i], float(scores[i]), r, int(i)) for r, i in enumerate(order))
    )


class BaseRanker(ABC):
    """Scores (query, passage) pairs; higher is more useful.

    Example::

        ranker = load_reranker("bm25")
        ranker.rank("who wrote hamlet", ["Hamlet is by Shakespeare.", "Paris"]).top_k(1)
    """

    name: str = "base"
    #: a passage's score does not depend on the other passages, so a long list may be scored in parts
    pointwise: bool = True

    #: True when ``score`` returns sigmoid outputs (calibration then fits on their logits)
    score_is_probability: bool = False
    #: set by :meth:`calibrate` (or shipped with a model); see :mod:`ragsieve.rerank.calibration`
    calibration = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.score is BaseRanker.score and cls.score_pairs is BaseRanker.score_pairs:
            raise TypeError(f"{cls.__name__} must implement score() or score_pairs()")

    def score(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        """One score per passage, in input order (higher = more relevant / useful)."""
        return np.asarray(self.score_pairs([query] * len(passages), passages), dtype=float)

    def score_pairs(self, queries: Sequence[str], passages: Sequence[Passage | str]) -> np.ndarray:
        """One score per aligned (query, passage) pair; the default calls :meth:`score` once per query."""
        if len(queries) != len(passages):
            raise RagsieveError(f"got {len(queries)} queries but {len(passages)} passages")
        items = as_passages(passages)
        scores = np.zeros(len(items), dtype=float)
        by_query: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            by_query.setdefault(q, []).append(i)
        for query, idx in by_query.items():
            scores[idx] = np.asarray(self.score(query, [items[i] for i in idx]), dtype=float)
        return scores

    def window(self) -> "tuple[Any, int] | None":
        """``(tokenizer, limit)`` when this ranker reads at most ``limit`` tokens of a (query, passage) pair and
        silently truncates the rest (``tokenizer`` a Hugging Face fast tokenizer, so a caller can cut a longer
        passage into pieces that fit: ``serve`` does), None when it reads passages of any length."""
        return None

    def rank(self, query: str, passages: Sequence[Passage | str]) -> RankedResults:
        if not isinstance(query, str) or not query.strip():
            raise RagsieveError("empty query")
        items = as_passages(passages)
        if not items:
            return RankedResults(query, ())
        scores = np.asarray(self.score(query, items), dtype=float)
        if scores.shape != (len(items),):
            raise RagsieveError(f"{self.name} returned {scores.shape} scores for {len(items)} passages")
        return ranked_from_scores(query, items, scores)

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
        scores = self.score_pairs(queries, passages)
        self.calibration = Calibration.fit(scores, labels, from_probability=self.score_is_probability)
        return self.calibration

    def predict_proba(self, query: str, passages: Sequence[Passage | str]) -> np.ndarray:
        """Calibrated probability that each passage is relevant, in input order (needs a calibration).

        The same value ``/v1/rerank`` returns as ``relevance_score`` (:meth:`unit_scores` of the raw scores).
        """
        if self.calibration is None:
            raise RagsieveError(f"{self.name} is not calibrated: call calibrate() on labelled dev pairs first")
        items = as_passages(passages)
        return self.unit_scores(self.score(query, items)) if items else np.zeros(0)

    def logit_scores(self, scores: Sequence[float]) -> np.ndarray:
        """Raw scores on the logit scale: sigmoid outputs (``score_is_probability``) are mapped back to their
        logit, anything else is returned as is. What TEI's ``raw_scores: true`` answers.

        Example::

            CrossEncoderRanker(path).logit_scores([0.5])   # array([0.])
        """
        from ragsieve.rerank.calibration import as_logits

        return as_logits(np.asarray(scores, dtype=float), self.score_is_probability)

    def unit_scores(self, scores: Sequence[float]) -> np.ndarray:
        """Raw scores of this ranker mapped into [0, 1], in the same order: what the rerank APIs return.

        * calibrated (the shipped rerankers, or after :meth:`calibrate`): the calibrated probability,
          equal to :meth:`predict_proba`;
        * sigmoid outputs (``score_is_probability``, e.g. a plain cross-encoder): the scores themselves;
        * anything else (BM25, cosine, retriever order): the logistic ``1 / (1 + exp(-score))``. This is
          *not* a probability, only a bounded score that keeps the order. It depends on the document
          alone, so the same document scores the same in every request; min-max scaling per request
          would give the best document 1.0 even when nothing is relevant, which no threshold survives.
          To threshold such a ranker, calibrate it on a few hundred labelled pairs.

        Example::

            load_reranker("bm25").unit_scores([0.0, 2.0])   # array([0.5, 0.88...])
        """
        from scipy.special import expit

        x = np.asarray(scores, dtype=float)
        if self.calibration is not None:
            return self.calibration.proba(x)
        if self.score_is_probability:
            return np.clip(x, 0.0, 1.0)
        return expit(x)

    def raw_threshold(self, threshold: float) -> float:
        """A threshold on the [0, 1] scale of :meth:`unit_scores` (the rerank and filter APIs') as a raw score
        of this ranker, the inverse of :meth:`unit_scores`: ``unit_scores(s) >= t`` exactly when
        ``s >= raw_threshold(t)`` (up to rounding). A logit ranker's 0 and 1 become -inf and +inf.

        What ``/v1/filter`` cuts with, since the grader and :class:`~ragsieve.pipeline.stages.SieveStages`
        keep raw thresholds (a sieve's ``sieve.json`` and a grader folder store them raw).

        Example::

            load_reranker("bm25").raw_threshold(0.5)   # 0.0 (the logit of 0.5)
        """
        from scipy.special import logit

        t = float(threshold)
        if not 0.0 <= t <= 1.0:
            raise RagsieveError(f"threshold: {threshold} is not in [0, 1]")
        if self.calibration is not None:
            return float(self.calibration.score_at(t))
        if self.score_is_probability:
            return t
        return float(logit(t))


class RetrievalOrder(BaseRanker):
    """No reranking: keeps the retriever's order (the "retriever only" row, ``load_reranker("none")``)."""

    name = "retriever"
    pointwise = False

    def score(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        return -np.arange(len(passages), dtype=float)
