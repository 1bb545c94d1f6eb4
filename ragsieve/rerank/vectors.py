"""A bounded, thread-safe cache of passage vectors, keyed by a digest of the exact text the encoder reads.

RAG traffic reranks passages of one corpus: the same documents come back request after request
(``/v1/rerank``, ``/v1/filter``, Python calls), and a two-model reranker would encode each again for its
cosine half. :class:`PassageVectorCache` keeps the most recently used vectors up to ``max_mb`` (least recently
used out first), shared by every request of a process (one per replica on Ray), and counts its hits and
misses. Passages retrieved from an index never reach it: they carry their stored vector
(:func:`ragsieve.data.records.stored_vector`).

Example::

    cache = PassageVectorCache(max_mb=64)
    cache.get_many(["key"])            # [None]: a miss
    cache.put_many(["key"], np.ones((1, 384), np.float32))
    cache.stats()                      # {'hits': 0, 'misses': 1, 'entries': 1, 'bytes': 1536, ...}
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Sequence

import numpy as np

#: the default bound: ≈ 170,000 MiniLM vectors (384 floats), a typical RAG corpus's working set
DEFAULT_CACHE_MB = 256.0


def vector_key(encoder: str, text: str) -> str:
    """The cache key of ``text`` as ``encoder`` reads it (spec and backend: another backend, another key)."""
    return hashlib.blake2b(f"{encoder}\x00{text}".encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class PassageVectorCache:
    """Least-recently-used passage vectors up to ``max_mb`` megabytes (0: cache nothing)."""

    def __init__(self, max_mb: float = DEFAULT_CACHE_MB):
        if max_mb < 0:
            raise ValueError(f"max_mb must be >= 0, got {max_mb}")
        self.max_bytes = int(max_mb * 1024 * 1024)
        self._items: OrderedDict[str, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = self.evicted = 0

    def get_many(self, keys: Sequence[str]) -> list[np.ndarray | None]:
        """The vector of each key (None: a miss); a hit becomes the most recently used."""
        out: list[np.ndarray | None] = []
        with self._lock:
            for key in keys:
                vec = self._items.get(key)
                if vec is None:
                    self.misses += 1
                else:
                    self._items.move_to_end(key)
                    self.hits += 1
                out.append(vec)
        return out

    def resize(self, max_mb: float) -> None:
        """A new bound (0: cache nothing), evicting the least recently used beyond it now."""
        if max_mb < 0:
            raise ValueError(f"max_mb must be >= 0, got {max_mb}")
        with self._lock:
            self.max_bytes = int(max_mb * 1024 * 1024)
            self._evict()

    def _evict(self) -> None:
        while self._bytes > self.max_bytes and self._items:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.nbytes
            self.evicted += 1

    def put_many(self, keys: Sequence[str], vectors: np.ndarray) -> None:
        """Store one vector per key (copied, read-only), evicting the least recently used beyond the bound."""
        if not self.max_bytes:
            return
        with self._lock:
            for key, vec in zip(keys, vectors):
                if key in self._items:
                    self._items.move_to_end(key)
                    continue
                vec = np.array(vec, dtype=np.float32)
                vec.setflags(write=False)
                self._items[key] = vec
                self._bytes += vec.nbytes
            self._evict()

    def stats(self) -> dict[str, int | float]:
        with self._lock:
            lookups = self.hits + self.misses
            return {"hits": self.hits, "misses": self.misses, "hit_ratio": self.hits / lookups if lookups else 0.0,
                    "entries": len(self._items), "bytes": self._bytes, "max_bytes": self.max_bytes,
                    "evicted": self.evicted}


def vector_encoders(ranker: object) -> list:
    """Every model inside ``ranker`` (a wrapper: best chunk, cosine mix, cascade) that encodes passages through
    a :class:`PassageVectorCache` — what a service sizes and reports."""
    found, seen, todo = [], set(), [ranker]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or not hasattr(obj, "__dict__"):
            continue
        seen.add(id(obj))
        if isinstance(getattr(obj, "vector_cache", None), PassageVectorCache):
            found.append(obj)
        todo.extend(v for v in vars(obj).values() if hasattr(v, "score_pairs"))
    return found


def vector_stats(ranker: object) -> dict[str, int | float] | None:
    """Passage vectors of every encoder inside ``ranker`` so far: read from an index (``stored``), encoded, and
    the cache's hits, misses, entries and bytes; None when it encodes no passages."""
    encoders = vector_encoders(ranker)
    if not encoders:
        return None
    total: dict[str, int | float] = {}
    for encoder in encoders:
        for key, value in encoder.vector_stats().items():
            if key != "cache_hit_ratio":
                total[key] = total.get(key, 0) + value
    lookups = total.get("cache_hits", 0) + total.get("cache_misses", 0)
    total["cache_hit_ratio"] = total.get("cache_hits", 0) / lookups if lookups else 0.0
    return total
