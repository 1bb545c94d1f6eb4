"""On-disk cache of hidden states in SQLite, keyed by (model, layer, prompt) hash."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ragsieve.artifacts import cache_rebuild, sqlite_error
from ragsieve.data.sqlite_keys import rows_with_keys


class StateCache:
    """A float32 vector store: ``put_many({key: vec})`` / ``get_many(keys)``.

    SQLite gives atomic commits, so an interrupted run keeps every batch it finished.

    Example::

        cache = StateCache("states.sqlite")
        cache.put_many({"k": np.ones(4, np.float32)})
        cache.get_many(["k"])["k"]
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path)
        with self._sqlite_errors():
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS states (key TEXT PRIMARY KEY, dim INTEGER, data BLOB)")
            self._db.commit()

    @contextmanager
    def _sqlite_errors(self) -> Iterator[None]:
        """A damaged cache file is one line saying to delete it (it only holds recomputable states)."""
        try:
            yield
        except sqlite3.Error as exc:
            raise sqlite_error(self.path, exc, cache_rebuild(self.path)) from None

    def get_many(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        with self._sqlite_errors():
            query = "SELECT key, dim, data FROM states WHERE key IN ({marks})"
            for key, dim, data in rows_with_keys(self._db, query, keys):
                out[key] = np.frombuffer(data, dtype=np.float32, count=dim).copy()
        return out

    def has_many(self, keys: Sequence[str]) -> set[str]:
        """The keys already stored (reads no vectors: a resume check over a large cache stays cheap)."""
        with self._sqlite_errors():
            return {k for (k,) in rows_with_keys(self._db, "SELECT key FROM states WHERE key IN ({marks})", keys)}

    def put_many(self, items: Mapping[str, np.ndarray]) -> None:
        rows = [(k, int(v.shape[-1]), np.asarray(v, dtype=np.float32).tobytes()) for k, v in items.items()]
        with self._sqlite_errors(), self._db:
            self._db.executemany("INSERT OR REPLACE INTO states VALUES (?, ?, ?)", rows)

    def __len__(self) -> int:
        with self._sqlite_errors():
            return int(self._db.execute("SELECT COUNT(*) FROM states").fetchone()[0])

    def close(self) -> None:
        self._db.close()
