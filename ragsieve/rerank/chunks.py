"""Split documents longer than the model window into chunks; a document scores as its best chunk.

A cross-encoder silently truncates a (query, document) pair at its window, so the end of
a long document would never be read. Here each document is cut, at token boundaries,
into pieces that fit beside the query; at most ``max_chunks_per_doc`` pieces are scored
(the rest is reported as truncated) and the document takes its best piece's score.
Rankers with no window (BM25) get every document whole.

Example::

    plan = plan_chunks(ranker, "who wrote hamlet", docs, max_chunks_per_doc=8)
    scores = plan.reduce(ranker.score_pairs([q] * len(plan.texts), plan.texts))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.rerank.base import BaseRanker, as_passages

# [CLS] q [SEP] d [SEP] and a margin: a chunk must never be cut again by the model
_SPECIAL_TOKENS = 4
_MIN_CHUNK_TOKENS = 32
MAX_CHUNKS_PER_DOC = 8  # a document past 8 windows is read to its 8th (and reported truncated by serve)


@dataclass
class ChunkPlan:
    """The texts to score and which document each came from."""

    texts: list[str]
    owner: list[int]
    n_docs: int
    chunked: dict[int, int] = field(default_factory=dict)  # doc index -> chunks scored
    truncated: list[int] = field(default_factory=list)  # docs whose tail beyond max_chunks_per_doc was not read

    def reduce(self, scores: np.ndarray) -> np.ndarray:
        """Best chunk score per document."""
        out = np.full(self.n_docs, -np.inf)
        np.maximum.at(out, np.asarray(self.owner, dtype=int), np.asarray(scores, dtype=float))
        return out


def plan_chunks(ranker: BaseRanker, query: str, docs: Sequence[str], max_chunks_per_doc: int) -> ChunkPlan:
    """Chunk the documents of one request for ``ranker`` (see the module doc)."""
    window = ranker.window()
    plan = ChunkPlan([], [], len(docs))
    if window is None:
        plan.texts, plan.owner = list(docs), list(range(len(docs)))
        return plan
    tokenizer, limit = window
    # A token spans at least one character, so short pairs need no tokenising at all.
    long_docs = [i for i, d in enumerate(docs) if len(query) + len(d) + _SPECIAL_TOKENS > limit]
    spans: dict[int, list[tuple[int, int]]] = {}
    if long_docs:
        q_tokens = len(tokenizer(query, add_special_tokens=False)["input_ids"])
        budget = max(limit - q_tokens - _SPECIAL_TOKENS, _MIN_CHUNK_TOKENS)
        enc = tokenizer(
            [docs[i] for i in long_docs], add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        for i, offsets in zip(long_docs, enc["offset_mapping"]):
            if len(offsets) <= budget:
                continue
            pieces = [offsets[lo : lo + budget] for lo in range(0, len(offsets), budget)]
            if len(pieces) > max_chunks_per_doc:
                plan.truncated.append(i)
                pieces = pieces[:max_chunks_per_doc]
            spans[i] = [(p[0][0], p[-1][1]) for p in pieces]
    for i, doc in enumerate(docs):
        if i in spans:
            plan.chunked[i] = len(spans[i])
            for lo, hi in spans[i]:
                plan.texts.append(doc[lo:hi])
                plan.owner.append(i)
        else:
            plan.texts.append(doc)
            plan.owner.append(i)
    return plan


class BestChunkRanker(BaseRanker):
    """``ranker`` reading a passage longer than its window as its best chunk, as ``serve`` scores documents.

    What :func:`~ragsieve.registry.load_reranker` returns for a ranker with a window, so ``score``,
    ``predict_proba``, the sieve and ``/v1/rerank`` read a long passage the same way. Everything but the
    chunking is the wrapped ranker's: attributes read and set go through to it (its calibration included),
    and ``.ranker`` is the model reading one window (what the studies' records score).

    Example::

        BestChunkRanker(load_reranker("embedded:base", whole_passages=False)).score("who wrote hamlet", [long])
    """

    _OWN = ("ranker", "max_chunks_per_doc")

    def __init__(self, ranker: BaseRanker, max_chunks_per_doc: int = MAX_CHUNKS_PER_DOC):
        object.__setattr__(self, "ranker", ranker)
        object.__setattr__(self, "max_chunks_per_doc", max_chunks_per_doc)

    # One scorer, one scale: a chunk's score is the wrapped ranker's own, so its calibration applies as is.
    def __getattr__(self, name: str):
        if name in BestChunkRanker._OWN:  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.ranker, name)

    def __setattr__(self, name: str, value) -> None:
        if name in BestChunkRanker._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.ranker, name, value)

    # BaseRanker's class defaults would shadow __getattr__ for these
    name = property(lambda self: self.ranker.name)
    calibration = property(lambda self: self.ranker.calibration, lambda self, value: setattr(self.ranker,
                                                                                            "calibration", value))
    score_is_probability = property(lambda self: self.ranker.score_is_probability)
    pointwise = property(lambda self: self.ranker.pointwise)

    def plan(self, query: str, docs: Sequence[str]) -> ChunkPlan:
        """The chunks of one query's documents, as :meth:`score_pairs` scores them."""
        return plan_chunks(self.ranker, query, docs, self.max_chunks_per_doc)

    def score_pairs(self, queries: Sequence[str], passages: Sequence[Passage | str]) -> np.ndarray:
        """Every pair's best chunk, all chunks scored in one call (the ranker keeps its length-sorted batches)."""
        if len(queries) != len(passages):
            raise RagsieveError(f"got {len(queries)} queries but {len(passages)} passages")
        items = as_passages(passages)
        texts = [p.full_text for p in items]
        by_query: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            by_query.setdefault(q, []).append(i)
        plans = [(q, idx, self.plan(q, [texts[i] for i in idx])) for q, idx in by_query.items()]
        # a passage read whole goes on as itself, so what it carries (an index's stored vector) reaches the model
        pieces = [t if o in plan.chunked else items[idx[o]]
                  for _, idx, plan in plans for t, o in zip(plan.texts, plan.owner)]
        scores = np.asarray(self.ranker.score_pairs([q for q, _, plan in plans for _ in plan.texts], pieces),
                            dtype=float)
        out, start = np.zeros(len(texts)), 0
        for _, idx, plan in plans:
            out[idx] = plan.reduce(scores[start:start + len(plan.texts)])
            start += len(plan.texts)
        return out

    def window(self) -> None:
        return None  # reads passages of any length (up to max_chunks_per_doc windows each)


def reading_whole(ranker: BaseRanker, max_chunks_per_doc: int = MAX_CHUNKS_PER_DOC) -> BaseRanker:
    """``ranker`` as a :class:`BestChunkRanker` when its class states a window, else itself (it reads any length
    already). Decided from the class, not by calling ``window()``, which may load a model (the cosine's MiniLM)."""
    if isinstance(ranker, BestChunkRanker) or type(ranker).window is BaseRanker.window:
        return ranker
    return BestChunkRanker(ranker, max_chunks_per_doc)


def reading_key(whole_passages: bool = True, max_chunks_per_doc: int = MAX_CHUNKS_PER_DOC) -> str:
    """How a windowed ranker reads a passage past its window, for the keys of stored scores: a score read by
    the best of ``max_chunks_per_doc`` chunks is not the score read to the first window, so records of one
    reading must never stand in for the other."""
    return f"best-chunk{max_chunks_per_doc}" if whole_passages else "first-window"


def window_reader(ranker: BaseRanker) -> BaseRanker:
    """The ranker that reads one window: the one a :class:`BestChunkRanker` wraps, else ``ranker`` itself."""
    return ranker.ranker if isinstance(ranker, BestChunkRanker) else ranker
