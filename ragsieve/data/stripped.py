"""Committed result rows keep ids, scores and labels; dataset text is joined back by id when needed.

Benchmark questions and passages are third-party text (BioASQ allows research use only), so a
study never commits them: it writes the rows it needs again (preference groups, labelled pairs)
*stripped* of their text fields, with a short digest of what was stripped, and a rerun or report
joins the text back from the datasets under ``RAGSIEVE_DATA`` by id. The digest makes a join
from a different copy of a dataset fail loudly instead of training on other text.

Each row format names its text fields once as :class:`TextField` tuples, next to its record
type (``PREFERENCE_TEXT``, ``GRADING_PAIR_TEXT``).

Example::

    fields = (TextField("query", "query_id", "question"), TextField("passage", "passage_id", "passage"))
    rows = strip_text([{"dataset": "nq-oracle", "query_id": "nq:1", "query": "who ...",
                        "passage_id": "wiki:2", "passage": "Title: ...", "label": 1}], fields)
    # [{"dataset": "nq-oracle", "query_id": "nq:1", "passage_id": "wiki:2", "label": 1, "text_sha1": "..."}]
    join_text(rows, fields)  # the text again, from load_dataset("nq-oracle")
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Sequence

from ragsieve.errors import DataError

DIGEST_FIELD = "text_sha1"


@dataclass(frozen=True)
class TextField:
    """One text field of a row and the field holding its id (a list of ids for a list of texts).

    ``kind`` says where the text comes from: a question's text, or a passage's ``full_text``
    (title and text, the way rankers see it; "" for a passage with no text).
    """

    text: str
    ids: str
    kind: Literal["question", "passage"]


def text_digest(row: dict[str, Any], fields: Sequence[TextField]) -> str:
    """A short digest of a row's text fields (what a stripped row keeps to check its join)."""
    texts = [row.get(f.text) for f in fields]
    return hashlib.sha1(json.dumps(texts, ensure_ascii=False).encode("utf-8")).hexdigest()[:12]


def strip_text(rows: Iterable[dict[str, Any]], fields: Sequence[TextField]) -> list[dict[str, Any]]:
    """The rows without their text fields, each with the digest of what was removed."""
    drop = {f.text for f in fields}
    return [{**{k: v for k, v in row.items() if k not in drop}, DIGEST_FIELD: text_digest(row, fields)}
            for row in rows]


def is_stripped(row: dict[str, Any], fields: Sequence[TextField]) -> bool:
    return DIGEST_FIELD in row and not any(f.text in row for f in fields)


class DatasetText:
    """Question and passage text by id, from datasets loaded once each (``data_dir`` or RAGSIEVE_DATA)."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None) -> None:
        self.data_dir = data_dir
        self._questions: dict[str, dict[str, str]] = {}
        self._passages: dict[str, dict[str, str]] = {}

    def _load(self, dataset: str) -> None:
        from ragsieve.data.loaders import load_dataset

        ds = load_dataset(dataset, data_dir=self.data_dir)
        self._questions[dataset] = {q.id: q.text for q in ds.questions}
        self._passages[dataset] = {p.id: p.full_text if p.text.strip() else "" for p in ds.passages}

    def lookup(self, dataset: str, kind: str, id_: str) -> str:
        """The text of question or passage ``id_``; an id prefixed ``<dataset>:`` is also found without it."""
        if dataset not in self._questions:
            self._load(dataset)
        table = self._questions[dataset] if kind == "question" else self._passages[dataset]
        text = table.get(id_)
        if text is None:
            text = table.get(id_.removeprefix(f"{dataset}:"))
        if text is None:
            raise DataError(f"{dataset} has no {kind} '{id_}': the results were made from another copy of it")
        return text


def join_text(
    rows: Iterable[dict[str, Any]], fields: Sequence[TextField], *, dataset_field: str = "dataset",
    data_dir: str | os.PathLike[str] | None = None, where: str = "rows", text: DatasetText | None = None,
) -> list[dict[str, Any]]:
    """Stripped rows with their text fields filled in from the dataset each row names in ``dataset_field``.

    Rows that still hold their text pass through unchanged. A joined row whose text does not match
    its recorded digest is an error naming the file (``where``) and line.
    """
    text = text or DatasetText(data_dir)
    out = []
    for lineno, row in enumerate(rows, 1):
        if not is_stripped(row, fields):
            out.append(row)
            continue
        dataset = row.get(dataset_field)
        if not dataset:
            raise DataError(f"{where}:{lineno}: a stripped row needs '{dataset_field}' to join its text from")
        joined = {k: v for k, v in row.items() if k != DIGEST_FIELD}
        for f in fields:
            ids = row.get(f.ids)
            if isinstance(ids, list):
                joined[f.text] = [text.lookup(dataset, f.kind, str(i)) for i in ids]
            elif ids is not None:
                joined[f.text] = text.lookup(dataset, f.kind, str(ids))
            else:
                raise DataError(f"{where}:{lineno}: no '{f.ids}' to join '{f.text}' from")
        if text_digest(joined, fields) != row[DIGEST_FIELD]:
            raise DataError(f"{where}:{lineno}: the {dataset} text joined by id differs from the text the results "
                            f"were made with (another version of the dataset under {text.data_dir or 'RAGSIEVE_DATA'})")
        out.append(joined)
    return out
