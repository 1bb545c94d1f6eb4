"""Any ranker as a grader: its score plus a threshold tuned on labelled pairs.

MiniLM cosine, a cross-encoder (``embedded:base``) or any other
:class:`~ragsieve.rerank.base.BaseRanker` scores on its own scale (a cosine in [-1, 1],
a logit, a probability), so the threshold is what makes it a grader:
:meth:`RankerGrader.fit_threshold` picks the F1-best one on a training split
(``ragsieve.eval.classification.best_threshold``). The ranker is built by
:mod:`ragsieve.registry` from the saved config, so a grader folder is only a JSON file.
"""

from __future__ import annotations

from typing import ClassVar, Sequence

import numpy as np

from ragsieve.errors import RagsieveError
from ragsieve.grade.base import Grader, GraderConfig
from ragsieve.specs import DEFAULT_ENCODER, ModelSpec, join_spec, reranker_spec_or
from ragsieve.rerank.base import BaseRanker


class RankerGrader(Grader):
    """A ranker with a tuned threshold; ``kind`` says how ``config.base`` names the ranker.

    ============== ====================================================================
    kind           ``base``
    ============== ====================================================================
    ranker         any reranker spec (``embedded:base``, ``bi-encoder``, ``bm25``, ...)
    cosine         an encoder spec: MiniLM cosine by default (``bi-encoder:<base>``)
    cross-encoder  a cross-encoder folder / HF id, or a reranker spec
    ============== ====================================================================

    Example::

        from ragsieve.registry import new_grader
        grader = new_grader("cosine")
        grader.fit(train_queries, train_passages, train_labels)   # tunes the threshold
        grader.grade("who wrote hamlet?", ["Hamlet is by Shakespeare."])
    """

    kind: ClassVar[str] = "ranker"
    default_base: ClassVar[str] = ""

    def __init__(self, config: GraderConfig, ranker: BaseRanker):
        super().__init__(config)
        self.ranker = ranker
        # its scores are the ranker's: the same [0, 1] mapping (unit_scores, raw_threshold) applies
        self.score_is_probability = ranker.score_is_probability
        self.calibration = ranker.calibration
        # key of the cross-encoder weights behind ``ranker`` (set by the registry), recorded with a
        # fitted threshold so that loading it over other weights is refused
        self.ranker_weights: str | None = None

    @classmethod
    def ranker_spec(cls, config: GraderConfig) -> str:
        """The reranker spec this grader wraps: ``base`` itself (any reranker spec)."""
        return config.base

    @classmethod
    def create(cls, config: GraderConfig) -> "RankerGrader":
        raise RagsieveError(f"a '{config.kind}' grader wraps a ranker: build it with ragsieve.registry.new_grader")

    def _score(self, queries: list[str], passages: list[str]) -> np.ndarray:
        """The ranker's score; a passage longer than its window by its best chunk, as the sieve ranks it (a long
        passage ranked first for its last paragraph is graded on that paragraph too)."""
        from ragsieve.rerank.chunks import reading_whole

        return np.asarray(reading_whole(self.ranker).score_pairs(queries, passages), dtype=np.float64)

    def fit_threshold(self, scores: Sequence[float], labels: Sequence[int], metric: str = "f1") -> float:
        """Set (and return) the threshold that maximises ``metric`` on these training scores."""
        from ragsieve.eval.classification import best_threshold

        threshold = best_threshold(labels, scores, metric)
        trained = {"threshold_metric": metric, **({"ranker_weights": self.ranker_weights} if self.ranker_weights else {})}
        self.config = self.config.model_copy(update={"threshold": threshold, "trained": trained})
        return threshold

    def fit(self, queries, passages, labels, config=None, **kwargs) -> float:
        """Tune the threshold on labelled pairs (empty passages are left out)."""
        keep = [i for i, p in enumerate(passages) if p.strip()]
        scores = self.score_pairs([queries[i] for i in keep], [passages[i] for i in keep])
        return self.fit_threshold(scores, np.asarray(labels)[keep])


class CosineGrader(RankerGrader):
    """MiniLM (or any bi-encoder) cosine between query and passage, relevant above a threshold."""

    kind: ClassVar[str] = "cosine"
    default_base: ClassVar[str] = DEFAULT_ENCODER

    @classmethod
    def normalize_base(cls, base: str) -> str:
        return str(ModelSpec.parse(base))

    @classmethod
    def ranker_spec(cls, config: GraderConfig) -> str:
        """``bi-encoder:<base>``: ``base`` is an encoder spec, never a reranker's."""
        return join_spec("bi-encoder", config.base)


class CrossEncoderGrader(RankerGrader):
    """A cross-encoder reranker (a folder, HF id or reranker spec such as ``embedded:base``) with a tuned threshold."""

    kind: ClassVar[str] = "cross-encoder"

    @classmethod
    def ranker_spec(cls, config: GraderConfig) -> str:
        """``base`` when it is a reranker spec (``embedded:base``), else ``cross-encoder:<folder or HF id>``."""
        return reranker_spec_or(config.base, "cross-encoder")
