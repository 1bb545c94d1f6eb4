"""A two-stage cascade: cosine over every candidate, the cross-encoder only on the best ``top`` by cosine.

The default reranker (``embedded:base``) is a cross-encoder logit plus a weighted MiniLM cosine. Cosine is
nearly free once passage vectors are stored (an index hit carries its vector) or cached, while the
cross-encoder is the cost of every pair. :class:`CascadeRanker` scores each query's candidates by cosine,
runs the cross-encoder on its ``top`` best only and gives those the full score (``logit + w · scale · cos``,
exactly the reranker's), and ranks the rest below them in cosine order. ``embedded:fast`` is the shipped
default behind a cascade; ``cascade:<top>`` wraps ``embedded:base`` and ``cascade:<top>:<spec>`` any
cross-encoder spec (a plain cross-encoder keeps its own logit for the top and MiniLM cosine to choose them).

Example::

    fast = CascadeRanker(load_reranker("embedded:base", whole_passages=False), top=10)
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

    def __init__(self, reranker: BaseRanker, top: int, cosine: BaseRanker | None = None):
        from ragsieve.rerank.chunks import BestChunkRanker
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
        self.score_is_probability = False  # logit scale, like the mix

    def window(self):
        return self.reranker.window()

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
        logits = np.asarray(self.cross.logit_scores(self.cross.score_pairs([queries[i] for i in todo],
                                                                           [items[i] for i in todo])), float)
        out = np.empty(len(items))
        out[todo] = logits + self.factor * cos[todo]
        for q, idx in by_query.items():
            top = set(chosen[q])
            rest = [i for i in idx if i not in top]
            if rest:  # below every reranked candidate, in cosine order
                floor = out[chosen[q]].min() - 1.0
                out[rest] = floor - max(self.factor, 1.0) * (cos[rest].max() - cos[rest])
        return out
