"""Shared pieces of every retriever: the :class:`Hit` record, the :class:`Retriever` contract
and the passages file format.

A retriever owns its passage pool (``passages``), answers ``search(query, k)`` with hits
sorted best first, and can ``save`` itself to a folder and ``load`` it back.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Iterable, Sequence

from ragsieve.data.records import Passage
from ragsieve.errors import DataError, RagsieveError

PASSAGES_FILE = "passages.jsonl"


@dataclass(frozen=True)
class Hit:
    """One retrieved passage.

    ``score`` is the retriever's own score (BM25 score, cosine similarity, RRF score),
    higher is better; ``rank`` is the 0-based position in the result list.

    Example::

        hit = Hit(Passage("p1", "Paris is in France."), score=0.83, rank=0)
    """

    passage: Passage
    score: float
    rank: int


def check_passages(passages: Iterable[Passage]) -> list[Passage]:
    """Return ``passages`` as a list; raise if it is empty or an id repeats.

    Example::

        check_passages([Passage("a", "x"), Passage("a", "y")])  # RagsieveError: duplicate passage id 'a'
    """
    out = list(passages)
    if not out:
        raise RagsieveError("no passages to index")
    seen: set[str] = set()
    for p in out:
        if not isinstance(p, Passage):
            raise RagsieveError(f"expected Passage objects, got {type(p).__name__}")
        if p.id in seen:
            raise RagsieveError(f"duplicate passage id '{p.id}': passage ids must be unique")
        seen.add(p.id)
    return out


def write_passages(passages: Iterable[Passage], path: str | Path) -> None:
    """Write passages as JSON lines ``{"id", "text", "title"}`` (+ ``"meta"`` when a passage has any).

    Example::

        write_passages([Passage("p1", "text", "Title")], "idx/passages.jsonl")
    """
    with open(path, "w", encoding="utf-8") as fh:
        for p in passages:
            row = {"id": p.id, "text": p.text, "title": p.title}
            if p.meta:
                row["meta"] = p.meta
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_passages(path: str | Path) -> list[Passage]:
    """Read a file written by :func:`write_passages`; a bad line raises :class:`DataError` naming file:line.

    Example::

        passages = read_passages("idx/passages.jsonl")
    """
    from ragsieve.artifacts import INDEX_REBUILD
    from ragsieve.data.jsonl import read_jsonl

    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: passages file missing; the index is incomplete, {INDEX_REBUILD}")
    out: list[Passage] = []
    try:
        for lineno, row in read_jsonl(path).numbered():  # the shared UTF-8 / JSON-lines policy
            text, title = row.get("text"), row.get("title", "")
            if "id" not in row or not isinstance(text, str) or not isinstance(title, str):
                raise DataError(f"{path}:{lineno}: bad passage line (needs 'id' and a 'text' string)")
            meta = row.get("meta") if isinstance(row.get("meta"), dict) else {}
            out.append(Passage(id=str(row["id"]), text=text, title=title, meta=meta))
    except DataError as exc:
        raise DataError(f"{exc}; {INDEX_REBUILD}") from None
    return out


class Retriever(ABC):
    """A searchable passage pool.

    Subclasses implement :meth:`_search` (and may override :meth:`_search_batch` when
    batching is cheaper), :meth:`build`, :meth:`save` and :meth:`load`. The public
    :meth:`search` / :meth:`search_batch` validate inputs once for every subclass:

    * an empty or whitespace-only query raises ``RagsieveError("empty query")``;
    * ``k <= 0`` raises; ``k`` larger than the pool returns the whole (matching) pool.

    Example::

        hits = retriever.search("who wrote Hamlet", k=5)
        [(h.rank, h.passage.id, round(h.score, 3)) for h in hits]
    """

    kind: ClassVar[str] = ""
    #: folder inside an index directory (see :mod:`ragsieve.retrieve.index`) that holds this kind
    subdir: ClassVar[str] = ""
    #: whether :meth:`build` takes an ``encoder_spec``
    uses_encoder: ClassVar[bool] = False

    def __init__(self, passages: Sequence[Passage]) -> None:
        self._passages = list(passages)

    @property
    def passages(self) -> list[Passage]:
        """The indexed passages, in index order (position ``i`` is internal id ``i``)."""
        return self._passages

    def __len__(self) -> int:
        return len(self._passages)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_passages={len(self._passages)})"

    # -- public API -------------------------------------------------------------------------
    def search(self, query: str, k: int = 10) -> list[Hit]:
        """Top-``k`` hits for one query, best first.

        Example::

            retriever.search("capital of France", k=3)[0].passage.id
        """
        _check_query(query)
        return self._search(query, _check_k(k))

    def search_batch(self, queries: list[str], k: int = 10) -> list[list[Hit]]:
        """Top-``k`` hits for each query (same order as ``queries``).

        Example::

            retriever.search_batch(["q one", "q two"], k=5)
        """
        if isinstance(queries, str):
            raise RagsieveError("search_batch takes a list of queries; use search() for one string")
        k = _check_k(k)
        queries = list(queries)
        for q in queries:
            _check_query(q)
        return self._search_batch(queries, k) if queries else []

    # -- subclass hooks ---------------------------------------------------------------------
    @abstractmethod
    def _search(self, query: str, k: int) -> list[Hit]:
        """Search with an already validated query and ``k >= 1``."""

    def _search_batch(self, queries: list[str], k: int) -> list[list[Hit]]:
        return [self._search(q, k) for q in queries]

    @classmethod
    @abstractmethod
    def build(cls, passages: Iterable[Passage], **options: object) -> "Retriever":
        """Index ``passages`` and return a ready retriever."""

    @abstractmethod
    def save(self, path: str | Path, *, with_passages: bool = True) -> None:
        """Write the retriever into folder ``path`` (created if needed).

        ``with_passages=False`` skips ``passages.jsonl`` when a caller (an index directory)
        stores the passages once for several retrievers.
        """

    @classmethod
    @abstractmethod
    def load(cls, path: str | Path, *, passages: Sequence[Passage] | None = None) -> "Retriever":
        """Load a retriever saved with :meth:`save`; ``passages`` overrides ``path/passages.jsonl``."""

    # -- helpers for subclasses -------------------------------------------------------------
    def _hits(self, indices: Iterable[int], scores: Iterable[float]) -> list[Hit]:
        return [
            Hit(passage=self._passages[int(i)], score=float(s), rank=r)
            for r, (i, s) in enumerate(zip(indices, scores))
        ]

    def _save_passages(self, path: Path, with_passages: bool) -> None:
        if with_passages:
            write_passages(self._passages, path / PASSAGES_FILE)


def _load_passages(path: Path, passages: Sequence[Passage] | None) -> list[Passage]:
    return list(passages) if passages is not None else read_passages(path / PASSAGES_FILE)


def _check_query(query: str) -> None:
    if not isinstance(query, str):
        raise RagsieveError(f"query must be a string, got {type(query).__name__}")
    if not query.strip():
        raise RagsieveError("empty query")


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise RagsieveError(f"k must be a positive integer, got {k!r}")
    return k


def _check_dir(path: str | Path, kind: str, *required: str) -> Path:
    """The saved retriever's folder, after checking it and the ``required`` files exist."""
    path = Path(path)
    if not path.is_dir():
        raise RagsieveError(f"{path}: no saved {kind} retriever here (folder missing)")
    missing = [name for name in required if not (path / name).exists()]
    if missing:
        from ragsieve.artifacts import INDEX_REBUILD

        raise RagsieveError(f"{path}: incomplete {kind} index (missing {', '.join(missing)}); {INDEX_REBUILD}")
    return path
