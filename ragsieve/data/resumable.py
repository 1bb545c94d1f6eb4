"""Stream a batch job's results to a ``.jsonl`` file as they finish, and resume after a kill.

``grade`` over 2,000 passages or ``evolve step`` ran for minutes and wrote everything
only at the end, so a kill lost all of it. A :class:`ResumableJsonl` appends (and
fsyncs) each finished row at once; opened again on the same file, it knows which keys
are done, so a re-run only computes the rest. A row cut off by the kill is skipped
(and recomputed), never misread.

Example::

    out = ResumableJsonl("graded.jsonl", key=("query_id", "passage_id"))
    for pair in out.pending(pairs, key=lambda p: (p.query_id, p.passage_id)):
        out.write({"query_id": pair.query_id, "passage_id": pair.passage_id, "score": grade(pair)})
    rows = out.rows()  # every result, in the order written
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from ragsieve.data.jsonl import append_jsonl, read_jsonl
from ragsieve.errors import DataError

__all__ = ["ResumableJsonl"]

T = TypeVar("T")
Key = tuple[str, ...]


class ResumableJsonl:
    """An append-only ``.jsonl`` of results keyed by one field or a tuple of fields.

    ``overwrite=True`` starts afresh (the old file is removed); otherwise existing rows
    count as done. ``skipped`` is the number of unreadable lines found (a row cut by a
    kill). Keys compare as strings, so ``7`` and ``"7"`` are the same item.
    """

    def __init__(self, path: str | os.PathLike[str], key: str | tuple[str, ...] = "id", *, overwrite: bool = False):
        self.path = Path(path)
        self.fields = (key,) if isinstance(key, str) else tuple(key)
        if not self.fields:
            raise DataError("ResumableJsonl needs at least one key field")
        if overwrite:
            self.path.unlink(missing_ok=True)
        self._rows: dict[Key, dict[str, Any]] = {}
        self.skipped = 0
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        reader = read_jsonl(self.path, skip_bad=True)
        for lineno, row in reader.numbered():
            if any(f not in row for f in self.fields):
                raise DataError(
                    f"{self.path}:{lineno}: row lacks key field(s) {list(self.fields)}; "
                    "is this the output of another command? Use --overwrite to start afresh"
                )
            self._rows[self._key_of_row(row)] = row  # a later row for a key replaces the earlier
        self.skipped = reader.skipped

    def _key_of_row(self, row: dict[str, Any]) -> Key:
        return tuple(str(row[f]) for f in self.fields)

    @staticmethod
    def _normalise(key: Any) -> Key:
        return tuple(str(k) for k in key) if isinstance(key, tuple) else (str(key),)

    def __contains__(self, key: Any) -> bool:
        return self._normalise(key) in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def pending(self, items: Iterable[T], key: Callable[[T], Any] = lambda item: item) -> list[T]:
        """The ``items`` whose ``key(item)`` has no row yet, in their order."""
        return [item for item in items if self._normalise(key(item)) not in self._rows]

    def write(self, row: dict[str, Any]) -> None:
        """Append one finished result (durably: fsynced before returning)."""
        missing = [f for f in self.fields if f not in row]
        if missing:
            raise DataError(f"result row lacks key field(s) {missing}")
        append_jsonl(self.path, row)
        self._rows[self._key_of_row(row)] = row

    def rows(self) -> list[dict[str, Any]]:
        """Every result so far, one per key, in the order first written."""
        return list(self._rows.values())
