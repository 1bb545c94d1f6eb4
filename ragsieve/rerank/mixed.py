"""Cross-encoder logit plus a weighted bi-encoder cosine: ``s = logit + w * scale * cos``.

The safeguard the issue asks for, at inference: the bi-encoder's ordering generalises (it
was trained on ~1B pairs) while a cross-encoder trained on six datasets can learn their
shortcuts. ``w`` is tuned on dev groups (:func:`tune_cosine_weight`); ``w = 0`` is the
cross-encoder alone, a large ``w`` is cosine with the cross-encoder breaking near-ties.
``scale`` puts cosine on the logit scale (20 = the distillation teacher's scale).

Example::

    mixed = CosineMixRanker(load_reranker("cross-encoder:path"), weight=0.5)
    mixed.rank("who wrote hamlet", ["Hamlet is by Shakespeare.", "Paris"]).top_k(1)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.rerank.base import BaseRanker


class CosineMixRanker(BaseRanker):
    """``cross`` logit (sigmoid outputs are mapped back to logits) + ``weight * scale * cosine``."""

    name = "cross-encoder+cosine"

    def __init__(self, cross: BaseRanker, weight: float, scale: float = 20.0, encoder: str = DEFAULT_ENCODER,
                 cosine: BaseRanker | None = None, cosine_backend: str = "torch", threads: int | None = None):
        self.cross = cross
        self.weight = float(weight)
        self.scale = float(scale)
        self.encoder = encoder
        self.cosine_backend = cosine_backend  # an ENCODER_BACKENDS name (ONNX ones exported once, on first use)
        self.threads = threads
        self._cosine = cosine  # loaded on first use: load_reranker stays fast

    @property
    def cosine(self) -> BaseRanker:
        if self._cosine is None:
            from ragsieve.rerank.neural import BiEncoderRanker

            self._cosine = BiEncoderRanker(self.encoder, backend=self.cosine_backend, threads=self.threads)
        return self._cosine

    def window(self):
        """The cross-encoder's pair window, narrowed to the cosine's passage window when that is shorter: a
        passage that fits both is read whole by both models."""
        cross = self.cross.window()
        if cross is None or not self.weight:
            return cross
        cosine = self.cosine.window()
        return (cross[0], min(cross[1], cosine[1])) if cosine else cross

    def cross_logits(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        return self.cross.logit_scores(self.cross.score(query, passages))

    def score(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        s = self.cross_logits(query, passages)
        if self.weight:
            s = s + self.weight * self.scale * np.asarray(self.cosine.score(query, passages), dtype=float)
        return s

    def score_pairs(self, queries: Sequence[str], passages: Sequence[Passage | str]) -> np.ndarray:
        """Both models over all pairs at once (the base class would go query by query: serve's batches across
        requests, and a bench's pair list, would lose their length-sorted batching)."""
        s = self.cross.logit_scores(self.cross.score_pairs(queries, passages))
        if self.weight:
            s = s + self.weight * self.scale * np.asarray(self.cosine.score_pairs(queries, passages), dtype=float)
        return s


def tune_cosine_weight(
    logits: Sequence[np.ndarray], cosines: Sequence[np.ndarray], relevant: Sequence[np.ndarray],
    grid: Sequence[float] = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 1000.0), scale: float = 20.0,
) -> tuple[float, dict[float, float]]:
    """The grid weight with the best mean nDCG@10 over dev queries (ties: the smaller weight).

    Inputs are per query: cross-encoder logits, cosines and 0/1 relevance of the same docs.

    Example::

        w, by_w = tune_cosine_weight([np.array([2., 0.])], [np.array([.1, .9])], [np.array([1, 0])])
    """
    from ragsieve.eval.ranking import ranking_metrics

    qrels = {str(i): {str(j): 1 for j in np.flatnonzero(r)} for i, r in enumerate(relevant)}
    by_w = {}
    for w in grid:
        run = {str(i): {str(j): float(v) for j, v in enumerate(lg + w * scale * cs)}
               for i, (lg, cs) in enumerate(zip(logits, cosines))}
        by_w[float(w)] = ranking_metrics(qrels, run, ks=(10,), measures=("nDCG",))["nDCG@10"]
    best = max(by_w.values())
    return min(w for w, v in by_w.items() if v >= best - 1e-12), by_w
