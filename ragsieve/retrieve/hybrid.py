"""Hybrid retrieval: BM25 + dense, fused with reciprocal rank fusion (RRF).

RRF score of a passage = sum over the two rankings it appears in of ``1 / (rrf_k + rank + 1)``
(``rank`` 0-based, each ranking cut at ``depth``). Scores ignore the raw BM25 / cosine
values, so the two scales never need calibrating. Equal fused scores are ordered by passage id.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

from ragsieve.artifacts import INDEX_REBUILD, read_json_artifact, reading_artifact
from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.retrieve.base import Hit, Retriever, _check_dir, _load_passages, check_passages
from ragsieve.retrieve.bm25 import BM25Retriever
from ragsieve.retrieve.dense import DenseRetriever

_CONFIG_FILE = "hybrid.json"


def rrf_fuse(rankings: Sequence[Sequence[Hit]], *, rrf_k: int = 60, k: int | None = None) -> list[Hit]:
    """Fuse ranked hit lists with reciprocal rank fusion.

    Inputs: ``rankings`` (each best first; a passage's position in its list is its rank),
    ``rrf_k`` (damping constant, 60 in Cormack et al. 2009), ``k`` (cut, ``None`` = all).

    Example::

        fused = rrf_fuse([bm25.search(q, 100), dense.search(q, 100)], rrf_k=60, k=10)
        # a passage ranked 0 in one list and 2 in the other: 1/61 + 1/63
    """
    scores: dict[str, float] = {}
    passages: dict[str, Passage] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking):
            pid = hit.passage.id
            scores[pid] = scores.get(pid, 0.0) + 1.0 / (rrf_k + rank + 1)
            passages[pid] = hit.passage
    order = sorted(scores, key=lambda pid: (-scores[pid], pid))
    if k is not None:
        order = order[:k]
    return [Hit(passage=passages[pid], score=scores[pid], rank=r) for r, pid in enumerate(order)]


class HybridRetriever(Retriever):
    """BM25 and dense retrieval over the same passages, fused with RRF.

    Inputs: ``bm25`` and ``dense`` retrievers built on the same passages (same ids, same
    order), ``rrf_k`` (RRF constant), ``depth`` (how many hits each side contributes).

    Example::

        hybrid = HybridRetriever(BM25Retriever.build(ps), DenseRetriever.build(ps), rrf_k=60, depth=100)
        hybrid.search("who discovered penicillin", k=10)
    """

    kind = "hybrid"
    subdir = ""  # owns the whole index folder: bm25/ and dense/ inside it
    uses_encoder = True

    def __init__(self, bm25: BM25Retriever, dense: DenseRetriever, *, rrf_k: int = 60, depth: int = 100) -> None:
        if [p.id for p in bm25.passages] != [p.id for p in dense.passages]:
            raise RagsieveError("hybrid retrieval needs BM25 and dense indexes over the same passages in the same order")
        if rrf_k < 0 or depth <= 0:
            raise RagsieveError(f"need rrf_k >= 0 and depth > 0, got rrf_k={rrf_k}, depth={depth}")
        super().__init__(bm25.passages)
        self.bm25 = bm25
        self.dense = dense
        self.rrf_k = rrf_k
        self.depth = depth

    @classmethod
    def build(
        cls, passages: Iterable[Passage], *, rrf_k: int = 60, depth: int = 100, k1: float = 1.5, b: float = 0.75, **dense_options: object
    ) -> "HybridRetriever":
        """Build both indexes; ``k1``/``b`` go to BM25, everything else to :meth:`DenseRetriever.build`.

        Example::

            hybrid = HybridRetriever.build(passages, encoder_spec="embedded:all-minilm-l6-v2", exact=True)
        """
        passages = check_passages(passages)
        bm25 = BM25Retriever.build(passages, k1=k1, b=b)
        dense = DenseRetriever.build(passages, **dense_options)  # type: ignore[arg-type]
        return cls(bm25, dense, rrf_k=rrf_k, depth=depth)

    @property
    def truncated_count(self) -> int | None:
        return self.dense.truncated_count

    def _depth(self, k: int) -> int:
        return max(self.depth, k)

    def _search(self, query: str, k: int) -> list[Hit]:
        depth = self._depth(k)
        fused = rrf_fuse([self.bm25._search(query, depth), self.dense._search(query, depth)], rrf_k=self.rrf_k, k=k)
        return self.dense.attach_vectors(fused)  # a passage only BM25 found carries its vector too

    def _search_batch(self, queries: list[str], k: int) -> list[list[Hit]]:
        depth = self._depth(k)
        dense_hits = self.dense._search_batch(queries, depth)  # one batched encoder call
        return [  # a passage only BM25 found carries its vector too
            self.dense.attach_vectors(rrf_fuse([self.bm25._search(q, depth), d], rrf_k=self.rrf_k, k=k))
            for q, d in zip(queries, dense_hits)
        ]

    def save(self, path: str | Path, *, with_passages: bool = True) -> None:
        """Write ``bm25/``, ``dense/``, ``hybrid.json`` (and ``passages.jsonl``) into ``path``.

        Example::

            hybrid.save("my_index")
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.bm25.save(path / BM25Retriever.subdir, with_passages=False)
        self.dense.save(path / DenseRetriever.subdir, with_passages=False)
        (path / _CONFIG_FILE).write_text(json.dumps({"rrf_k": self.rrf_k, "depth": self.depth}, indent=2))
        self._save_passages(path, with_passages)

    @classmethod
    def load(cls, path: str | Path, *, passages: Sequence[Passage] | None = None) -> "HybridRetriever":
        """Load a folder written by :meth:`save`.

        Example::

            hybrid = HybridRetriever.load("my_index")
        """
        path = _check_dir(path, cls.kind, _CONFIG_FILE)
        config = read_json_artifact(path / _CONFIG_FILE, INDEX_REBUILD)
        with reading_artifact(path / _CONFIG_FILE, INDEX_REBUILD):
            rrf_k, depth = int(config["rrf_k"]), int(config["depth"])
        passages = _load_passages(path, passages)
        bm25 = BM25Retriever.load(path / BM25Retriever.subdir, passages=passages)
        dense = DenseRetriever.load(path / DenseRetriever.subdir, passages=passages)
        return cls(bm25, dense, rrf_k=rrf_k, depth=depth)
