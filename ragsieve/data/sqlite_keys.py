"""Rows of a SQLite table whose key is in a long list: the list sent in chunks, since SQLite caps the bound
parameters of one statement (999 in older builds).

Example::

    rows = rows_with_keys(db, "SELECT key, answer FROM answers WHERE key IN ({marks})", keys)
"""

from __future__ import annotations

import sqlite3
from typing import Any, Iterator, Sequence

#: keys per statement: under every SQLite build's parameter cap
CHUNK = 500


def rows_with_keys(db: sqlite3.Connection, query: str, keys: Sequence[str]) -> Iterator[tuple[Any, ...]]:
    """The rows of ``query`` (whose ``IN ({marks})`` takes the keys) for every key in ``keys``, chunk by chunk."""
    keys = list(keys)
    for lo in range(0, len(keys), CHUNK):
        chunk = keys[lo : lo + CHUNK]
        yield from db.execute(query.format(marks=",".join("?" * len(chunk))), chunk)
