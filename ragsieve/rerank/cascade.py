"""A two-stage cascade: cosine over every candidate, the cross-encoder only on the best ``top`` by cosine.

The default reranker (``embedded:base``) is a cross-encoder logit plus a weighted MiniLM cosine. Cosine is
nearly free once passage vectors are stored (an index hit carries its vector) or cached, while the
cross-encoder is the cost of every pair. :class:`CascadeRanker` scores each query's candidates by cosine,
runs the cross-encoder on its ``top`` best only and gives those the full score (``logit + w · scale · cos``,
exactly the reranker's; a passage past the reranker's window by its best chunk, as ``load_reranker`` reads it),
and ranks the rest below them in cosine order. It chooses among *passages*, not chunks, so it reads long
passages itself (no window of its own) and its scores depend on the list (``pointwise = False``: a service
scores one request's documents in one call). ``embedded:fast`` is the shipped
default behind a cascade; ``cascade:<top>`` wraps ``embedded:base`` and ``cascade:<top>:<spec>`` any
cross-encoder spec (a plain cross-encoder keeps its own logit for the top and MiniLM cosine to choose them).

Example::

    fast = CascadeRanker(load_reranker("embedded:base"), top=10)
    fast.rank("who wrote hamlet", passages).top_k(3)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.rerank.base import BaseRanker, as_passages

#: candidates ``embedded:fast`` cross-encodes per query: the smallest n within 0.01 nDCG@10 of ``embedded:base`` on
#: dev lists of all six in-domain sets (``experiments/cascade.yaml``, ``results/cascade/``)
FAST_TOP = 12


class CascadeRanker(BaseRanker):
    """Cosine for every candidate, ``reranker`` for the ``top`` best of each query (see the module doc)."""

    name = "cascade"
    pointwise = False  # which candidates reach the cross-encoder depends on the others

    def __init__(self, reranker: BaseRanker, top: int, cosine: BaseRanker | None = None):
        from ragsieve.rerank.chunks import BestChunkRanker, reading_whole
        from ragsieve.rerank.mixed import CosineMixRanker

        if top < 1:
            raise RagsieveError(f"cascade: top must be >= 1, got {top}")
        inner = reranker.ranker if isinstance(reranker, BestChunkRanker) else reranker
        self.top = int(top)
        self.reranker = inner
        if isinstance(inner, CosineMixRanker):  # the mix's own cosine chooses, and its term is reused
            self.cross, self.first, self.factor = inner.cross, inner.cosine, inner.weight * inner.scale
        else:
            from ragsieve.rerank.neural import BiEncoderRanker

            self.cross, self.first, self.factor = inner, cosine or BiEncoderRanker(), 0.0
        self.calibration = getattr(inner, "calibration", None)  # the top's scores are the reranker's own
        self.whole = reading_whole(inner)  # the top's full score, a long passage by its best chunk
        self.score_is_probability = False  # logit scale, like the mix

    def score_pairs(self, queries: Sequence[str], passages: Sequence[Passage | str]) -> np.ndarray:
        if len(queries) != len(passages):
            raise RagsieveError(f"got {len(queries)} queries but {len(passages)} passages")
        items = as_passages(passages)
        if not items:
            return np.zeros(0)
        cos = np.asarray(self.first.score_pairs(queries, items), dtype=float)
        by_query: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            by_query.setdefault(q, []).append(i)
        chosen = {q: sorted(idx, key=lambda i: (-cos[i], i))[: self.top] for q, idx in by_query.items()}
        todo = [i for idx in chosen.values() for i in idx]
        out = np.empty(len(items))
        if todo:  # the reranker's own score (cross logit + its cosine term), exactly as it ranks alone
            out[todo] = self._full_scores([queries[i] for i in todo], [items[i] for i in todo])
        for q, idx in by_query.items():
            top = set(chosen[q])
            rest = [i for i in idx if i not in top]
            if rest:  # below every reranked candidate, in cosine order
                floor = out[chosen[q]].min() - 1.0
                out[rest] = floor - max(self.factor, 1.0) * (cos[rest].max() - cos[rest])
        return out

    def _full_scores(self, queries: list[str], items: list[Passage]) -> np.ndarray:
        """The wrapped reranker's score on the logit scale (a mix's is already: cross logit + its cosine term)."""
        return np.asarray(self.whole.logit_scores(self.whole.score_pairs(queries, items)), float)
