"""Passage lists given on the command line (``rerank``, ``grade``)."""

from __future__ import annotations

from pathlib import Path

from ragsieve.data.jsonl import read_jsonl
from ragsieve.data.records import Passage
from ragsieve.errors import DataError
from ragsieve.text_input import check_input_file, read_text


def read_passages_file(path: str | Path) -> list[Passage]:
    """``.jsonl`` (or ``.jsonl.gz``) rows with ``text`` (or ``passage``) and optional ``title`` /
    ``id``, or a ``.txt`` file with one passage per line (blank lines skipped). An empty file gives [].
    Text is UTF-8 (a BOM is dropped); anything else is a one-line :class:`DataError`.
    Other suffixes are refused rather than guessed: a CSV read as text would grade its header row.

    Example::

        read_passages_file("candidates.jsonl")[0].full_text
    """
    path = check_input_file(path, "passages")
    name = path.name.lower()
    if not name.endswith((".jsonl", ".jsonl.gz", ".txt")):
        raise DataError(f"{path}: passages must be .jsonl or .txt (one passage per line)")
    if name.endswith(".txt"):
        lines = [line.strip() for line in read_text(path, "passages").splitlines()]
        return [Passage(str(i), line) for i, line in enumerate(line for line in lines if line)]
    passages = []
    for lineno, row in read_jsonl(path).numbered():
        text = row.get("text", row.get("passage")) if isinstance(row, dict) else None
        if not isinstance(text, str):
            raise DataError(f"{path}:{lineno}: a passage row needs a 'text' (or 'passage') string")
        passages.append(Passage(str(row.get("id", len(passages))), text, str(row.get("title", ""))))
    return passages
