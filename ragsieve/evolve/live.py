"""Feedback that arrives while a reranker is served, appended to its evolve store.

Rows come from ``POST /v1/feedback`` or ``ragsieve feedback add FILE``: a pointwise label
``{query, document, label}`` or a preference ``{query, chosen, rejected}`` (stored as a
positive and a negative row sharing a ``pair_id``), each with a ``source`` tag. They go
into the ``live_feedback`` table of ``<store>/evolve.sqlite`` (WAL mode: many writers,
one transaction per call, a busy writer waits instead of failing).

:func:`promote_feedback` turns every row that arrived since the last promotion into one
queued round whose examples all carry gold labels, so the next ``run_step`` trains it as
a full-feedback round; with no new feedback nothing is queued and a queued unlabelled
round runs as CautiousDPO as before. Promotion is one transaction (examples, labels, and
the rows marked with their round), so a kill leaves either all of it or none.

Example::

    append_feedback("state/fever", [FeedbackItem(query="claim", document="evidence", label=1, source="ui")])
    promote_feedback("state/fever")     # -> the queued round id, or None when nothing new arrived
    run_step("state/fever")             # trains it as a full-feedback round
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, Sequence

from pydantic import Field, ValidationError, model_validator

from ragsieve.config import StrictConfig, format_validation_error
from ragsieve.data.records import LabeledPair
from ragsieve.errors import DataError
from ragsieve.evolve.store import EvolveStore, _now
from ragsieve.evolve.store import _open as open_store

_LIVE_SCHEMA = """
CREATE TABLE IF NOT EXISTS live_feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT, query TEXT NOT NULL, document TEXT NOT NULL, label INTEGER NOT NULL,
    source TEXT NOT NULL, pair_id TEXT, fields TEXT, added_at TEXT NOT NULL, round INTEGER
);
CREATE INDEX IF NOT EXISTS live_feedback_round ON live_feedback(round);
"""


class FeedbackItem(StrictConfig):
    """One piece of feedback: ``document`` + ``label`` (1 relevant / 0 not), or ``chosen`` + ``rejected``."""

    query: str = Field(..., min_length=1)
    document: Optional[str] = None
    label: Optional[int] = Field(None, ge=0, le=1)
    chosen: Optional[str] = None
    rejected: Optional[str] = None
    source: str = Field("api", min_length=1, max_length=64)
    fields: dict[str, str] = {}  # extra template fields, when the store's template has more than query/passage

    @model_validator(mode="after")
    def _one_shape(self) -> "FeedbackItem":
        pointwise = self.document is not None and self.label is not None
        pairwise = self.chosen is not None and self.rejected is not None
        if pointwise == pairwise:
            raise ValueError("give either 'document' and 'label', or 'chosen' and 'rejected'")
        return self

    def rows(self) -> list[tuple[str, str, int, str, str | None, str]]:
        extra = json.dumps(self.fields) if self.fields else None
        if self.document is not None:
            return [(self.query, self.document, int(self.label), self.source, None, extra)]
        pair = uuid.uuid4().hex
        return [
            (self.query, self.chosen, 1, self.source, pair, extra),
            (self.query, self.rejected, 0, self.source, pair, extra),
        ]


@contextmanager
def _live(store_dir: str | Path) -> Iterator[EvolveStore]:
    """The store with the live table; a damaged file is one line (the store's own wrapper), never a traceback."""
    with open_store(store_dir) as store:
        store.conn.executescript(_LIVE_SCHEMA)
        yield store


def append_feedback(store_dir: str | Path, items: Sequence[FeedbackItem]) -> int:
    """Append ``items`` in one transaction; returns the number of rows written."""
    rows = [(*r, _now()) for item in items for r in item.rows()]
    with _live(store_dir) as store, store.transaction() as conn:
        conn.executemany(
            "INSERT INTO live_feedback (query, document, label, source, pair_id, fields, added_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
    return len(rows)


def read_feedback_file(path: str | Path) -> list[FeedbackItem]:
    """jsonl rows of :class:`FeedbackItem`; a bad row is one error naming ``file:line``."""
    from ragsieve.data import read_jsonl

    items = []
    for n, row in read_jsonl(path).numbered():
        try:
            items.append(FeedbackItem.model_validate(row))
        except ValidationError as exc:
            raise DataError(format_validation_error(exc, f"{path}:{n}")) from None
    if not items:
        raise DataError(f"{path}: no rows")
    return items


def pending_feedback(store_dir: str | Path) -> int:
    """Rows that arrived since the last promotion."""
    with _live(store_dir) as store:
        return store.conn.execute("SELECT COUNT(*) FROM live_feedback WHERE round IS NULL").fetchone()[0]


def promote_feedback(store_dir: str | Path) -> int | None:
    """Queue the feedback since the last promotion as one fully labelled round; its id, or None."""
    from ragsieve.prompts.verdicts import get_template

    with _live(store_dir) as store:
        template = get_template(store.config.template)
        with store.transaction() as conn:
            rows = conn.execute(
                "SELECT id, query, document, label, source, pair_id, fields FROM live_feedback"
                " WHERE round IS NULL ORDER BY id"
            ).fetchall()
            if not rows:
                return None
            rounds = [r[0] for r in conn.execute("SELECT round FROM examples UNION SELECT round FROM rounds")]
            round_id = max([r + 1 for r in rounds] or [0])
            examples = []
            for rowid, query, document, label, source, pair_id, extra in rows:
                fields = {f: "" for f in template.fields}
                fields.update(json.loads(extra) if extra else {})
                fields.update(template.fields_for(query, document))
                examples.append(
                    LabeledPair(
                        f"live-{rowid}",
                        pair_id or f"live-{rowid}",
                        query,
                        document,
                        int(label),
                        fields,
                        group=source,
                        dataset=template.name,
                    )
                )
            store._insert_examples(conn, examples, round_id)
            conn.executemany(
                "INSERT OR REPLACE INTO feedback (example_id, label, added_at) VALUES (?, ?, ?)",
                [(x.id, x.label, _now()) for x in examples],
            )
            conn.executemany("UPDATE live_feedback SET round = ? WHERE id = ?", [(round_id, r[0]) for r in rows])
        return round_id
