"""Graders that need no LLM: retrieval cosine and a cross-encoder, each with a tuned threshold.

Both score on their own scale (a cosine in [-1, 1], a cross-encoder logit), so the
threshold is what makes them graders: :meth:`fit_threshold` picks the F1-best one on a
training split (``ragsieve.eval.classification.best_threshold``).
"""

from __future__ import annotations

from typing import ClassVar, Sequence

import numpy as np

from ragsieve.errors import RagsieveError
from ragsieve.grade.base import Grader, GraderConfig
from ragsieve.models.specs import DEFAULT_ENCODER, ModelSpec


class _ThresholdGrader(Grader):
    def fit_threshold(self, scores: Sequence[float], labels: Sequence[int], metric: str = "f1") -> float:
        """Set (and return) the threshold that maximises ``metric`` on these training scores."""
        from ragsieve.eval.classification import best_threshold

        threshold = best_threshold(labels, scores, metric)
        self.config = self.config.model_copy(update={"threshold": threshold, "trained": {"threshold_metric": metric}})
        return threshold

    def fit(self, queries, passages, labels, config=None, **kwargs) -> float:
        """Tune the threshold on labelled pairs (empty passages are left out)."""
        keep = [i for i, p in enumerate(passages) if p.strip()]
        scores = self.score_pairs([queries[i] for i in keep], [passages[i] for i in keep])
        return self.fit_threshold(scores, np.asarray(labels)[keep])


class CosineGrader(_ThresholdGrader):
    """MiniLM (or any bi-encoder) cosine between query and passage, relevant above a threshold.

    Example::

        grader = new_grader("cosine")
        grader.fit_threshold(train_cosines, train_labels)
        grader.grade("who wrote hamlet?", ["Hamlet is by Shakespeare."])
    """

    kind: ClassVar[str] = "cosine"
    default_base: ClassVar[str] = DEFAULT_ENCODER

    def __init__(self, config: GraderConfig):
        from ragsieve.models.encoder import load_encoder

        super().__init__(config)
        self.encoder = load_encoder(config.base)

    @classmethod
    def normalize_base(cls, base: str) -> str:
        return str(ModelSpec.parse(base))

    @classmethod
    def create(cls, config: GraderConfig) -> "CosineGrader":
        return cls(config)

    def _score(self, queries: list[str], passages: list[str]) -> np.ndarray:
        unique = list(dict.fromkeys(queries))  # a grade() call repeats one query per passage
        q = self.encoder.encode(unique, batch_size=64, normalize_embeddings=True)
        p = self.encoder.encode(passages, batch_size=64, normalize_embeddings=True)
        row = {text: i for i, text in enumerate(unique)}
        return np.einsum("ij,ij->i", q[[row[t] for t in queries]], p).astype(np.float64)


class CrossEncoderGrader(_ThresholdGrader):
    """A cross-encoder reranker with a tuned logit threshold.

    ``base`` is a model folder / HF id (``load_reranker("cross-encoder:<base>")``) or a
    reranker spec such as ``embedded:base``.

    Example::

        grader = new_grader("cross-encoder", base="results/rerank/base")
        grader.fit(train_queries, train_passages, train_labels)
    """

    kind: ClassVar[str] = "cross-encoder"

    def __init__(self, config: GraderConfig):
        from ragsieve.rerank import RERANKERS, load_reranker

        if not config.base:
            raise RagsieveError("the cross-encoder grader needs base=<cross-encoder folder or HF id>")
        super().__init__(config)
        # A reranker spec (e.g. embedded:base) is used as is; anything else names a model folder / id.
        name = config.base.partition(":")[0]
        self.ranker = load_reranker(config.base if name in RERANKERS else f"cross-encoder:{config.base}")

    @classmethod
    def create(cls, config: GraderConfig) -> "CrossEncoderGrader":
        return cls(config)

    def _score(self, queries: list[str], passages: list[str]) -> np.ndarray:
        from ragsieve.data.records import Passage

        scores = np.zeros(len(queries), dtype=np.float64)
        by_query: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            by_query.setdefault(q, []).append(i)
        for query, idx in by_query.items():  # the reranker scores one query's passages at a time
            scores[idx] = self.ranker.score(query, [Passage(str(i), passages[i]) for i in idx])
        return scores
