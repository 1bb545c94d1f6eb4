"""A user's labelled (query, passage) rows: the one reader of ``{query, passage, label}`` JSONL.

What a user brings to fit a stage to their own data (a reranker's calibration, an evolving
reranker's first round): one JSON object per line with a non-empty ``query`` and ``passage`` and a
``label`` (0/1, true/false, or a label word the caller names); optional ``id`` and ``query_id``
(default: the query text, so rows of one question group together for intervals by query). A bad
row is one :class:`~ragsieve.errors.DataError` naming ``file:line``; nothing is half-read.

Example::

    pairs = read_labelled_pairs("my_labels.jsonl")      # [LabeledPair(id='row-1', query_id=..., label=1), ...]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from ragsieve.data.jsonl import read_jsonl
from ragsieve.data.records import LabeledPair
from ragsieve.errors import DataError

#: label words every reader accepts (callers add their template's words)
BOOLEAN_WORDS = {"true": 1, "false": 0}


def numbered_rows(path: str | Path) -> list[tuple[str, dict]]:
    """``(file:line, row)`` of a JSONL file; an empty file is an error."""
    rows = [(f"{path}:{n}", row) for n, row in read_jsonl(path).numbered()]
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def label_value(value: Any, where: str, words: dict[str, int]) -> int:
    """0/1 from ``value`` (0/1, a bool, or one of ``words``, case-insensitive)."""
    if isinstance(value, bool) or value in (0, 1):
        return int(value)
    if isinstance(value, str) and value.strip().lower() in words:
        return words[value.strip().lower()]
    raise DataError(f"{where}: label {value!r} is not 0/1 or a label word ({', '.join(words)})")


def labelled_rows(path: str | Path, words: dict[str, int] | None = None) -> Iterator[tuple[str, dict, LabeledPair]]:
    """Each row checked: ``(file:line, the row, its LabeledPair)``; ids unique across the file."""
    words = {**BOOLEAN_WORDS, **(words or {})}
    seen: set[str] = set()
    for where, row in numbered_rows(path):
        for key in ("query", "passage"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise DataError(f"{where}: '{key}' must be a non-empty string")
        if "label" not in row:
            raise DataError(f"{where}: missing 'label' (0/1 or {'/'.join(words)})")
        example_id = str(row.get("id", f"row-{where.rsplit(':', 1)[1]}"))
        if example_id in seen:
            raise DataError(f"{where}: duplicate id {example_id!r}")
        seen.add(example_id)
        pair = LabeledPair(example_id, str(row.get("query_id", row["query"])), row["query"], row["passage"],
                           label_value(row["label"], where, words))
        yield where, row, pair


def read_labelled_pairs(path: str | Path, words: dict[str, int] | None = None) -> list[LabeledPair]:
    """Every row of ``path`` as a :class:`LabeledPair` (see the module docstring for the format)."""
    return [pair for _, _, pair in labelled_rows(path, words)]
