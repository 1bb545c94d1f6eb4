"""Feedback and traffic that arrive while a reranker is served, appended to its evolve store.

Feedback rows come from ``POST /v1/feedback`` or ``ragsieve feedback add FILE``: a pointwise
label ``{query, document, label}`` or a preference ``{query, chosen, rejected}`` (stored as a
positive and a negative row sharing a ``pair_id``), each with a ``source`` tag. They go into
the store's ``live_feedback`` table (:mod:`ragsieve.evolve_db`: SQLite in WAL mode, where a busy
writer waits instead of failing, or PostgreSQL, which every serve replica can write to), one
transaction per call.

Traffic (``ragsieve serve --log-traffic``): every served (query, document) pair, once
(:func:`traffic_key`), into ``live_traffic``, at most the store's ``max_traffic`` waiting;
:class:`TrafficLog` writes it from a background thread, never on the request path.

:func:`promote_feedback` turns every feedback row since the last promotion into one queued
round whose examples all carry gold labels, placed AHEAD of any queued round with unlabelled
examples (those move back one), so the next ``run_step`` trains on what the user said before
anything the model labels itself. :func:`promote_traffic` turns the traffic since the last
promotion into one unlabelled round at the end of the queue (CautiousDPO labels it). Each
promotion is one transaction, so a kill leaves either all of it or none.

Example::

    append_feedback("state/mine", [FeedbackItem(query="claim", document="evidence", label=1, source="ui")])
    promote_feedback("state/mine")     # -> the queued round id, or None when nothing new arrived
    promote_traffic("state/mine")      # served pairs since the last round -> an unlabelled round
    run_step("state/mine")             # the feedback round first
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, Sequence, Union

from pydantic import Field, ValidationError, model_validator
from sqlalchemy import func, select, union, update
from sqlalchemy.engine import Connection

from ragsieve import evolve_db as db
from ragsieve.config import StrictConfig, format_validation_error
from ragsieve.data.records import LabeledPair
from ragsieve.errors import DataError
from ragsieve.evolve.store import EvolveStore, _now
from ragsieve.evolve.store import _open as open_store
from ragsieve.evolve_db import StoreLocation, insert_new, insert_rows, upsert

#: a store: its folder, a ``postgresql://`` URL, or a :class:`~ragsieve.evolve_db.StoreLocation`
Store = Union[str, Path, StoreLocation]


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

    def rows(self) -> list[dict]:
        """Its ``live_feedback`` rows (a preference: two, sharing a ``pair_id``)."""
        extra = json.dumps(self.fields) if self.fields else None
        common = {"query": self.query, "source": self.source, "fields": extra}
        if self.document is not None:
            return [{**common, "document": self.document, "label": int(self.label), "pair_id": None}]
        pair = uuid.uuid4().hex
        return [
            {**common, "document": self.chosen, "label": 1, "pair_id": pair},
            {**common, "document": self.rejected, "label": 0, "pair_id": pair},
        ]


@contextmanager
def _live(store: Store) -> Iterator[EvolveStore]:
    """The open store; a damaged file or a lost server is one line (the store's own wrapper), never a traceback."""
    with open_store(store) as opened:
        yield opened


def append_feedback(store: Store, items: Sequence[FeedbackItem]) -> int:
    """Append ``items`` in one transaction; returns the number of rows written."""
    rows = [{**r, "added_at": _now()} for item in items for r in item.rows()]
    # a pure append reads nothing it depends on: on PostgreSQL it needs no writer lock (replicas write side by side)
    with _live(store) as opened, opened.transaction(lock=False) as conn:
        insert_rows(conn, db.live_feedback, rows)
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


def pending_feedback(store: Store) -> int:
    """Rows that arrived since the last promotion."""
    with _live(store) as opened:
        t = db.live_feedback
        return opened._rows(select(func.count()).select_from(t).where(t.c.round.is_(None)))[0][0]


def _feedback_slot(conn: Connection) -> int:
    """The round a new feedback round takes: right after the queued full-feedback rounds, before any
    round with unlabelled examples (traffic, an ingested batch, a benchmark round), which move back
    one. Feedback is what the user said; it trains before anything the model labels itself."""
    done = [r[0] for r in conn.execute(select(db.rounds.c.round))]
    first_open = max(done) + 1 if done else 0
    e, f = db.examples, db.feedback
    queued = conn.execute(
        select(e.c.round, func.count(), func.count(f.c.example_id))
        .join(f, f.c.example_id == e.c.id, isouter=True)
        .where(e.c.round >= first_open).group_by(e.c.round).order_by(e.c.round)
    ).all()
    slot = next((r for r, n, labelled in queued if labelled < n), None)
    if slot is None:
        return max([first_open, *[r + 1 for r, _, _ in queued]])
    for table in (db.examples, db.live_feedback, db.live_traffic):
        conn.execute(update(table).where(table.c.round >= slot).values(round=table.c.round + 1))
    return slot


def promote_feedback(store: Store) -> int | None:
    """Queue the feedback since the last promotion as one fully labelled round, ahead of any queued
    unlabelled round (:func:`_feedback_slot`); its id, or None."""
    with _live(store) as opened:
        template = opened.config.verdict_template()
        with opened.transaction() as conn:
            t = db.live_feedback
            rows = conn.execute(
                select(t.c.id, t.c.query, t.c.document, t.c.label, t.c.source, t.c.pair_id, t.c.fields)
                .where(t.c.round.is_(None)).order_by(t.c.id)
            ).all()
            if not rows:
                return None
            round_id = _feedback_slot(conn)
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
            opened._insert_examples(conn, examples, round_id)
            upsert(conn, db.feedback, [{"example_id": x.id, "label": x.label, "added_at": _now()} for x in examples],
                   ["example_id"])
            _mark_promoted(conn, t, [r[0] for r in rows], round_id)
        return round_id


def _mark_promoted(conn: Connection, table, ids: list[int], round_id: int) -> None:
    for start in range(0, len(ids), 500):  # bounded IN lists
        conn.execute(update(table).where(table.c.id.in_(ids[start:start + 500])).values(round=round_id))


# --------------------------------------------------------------------------- served traffic

log = logging.getLogger("ragsieve.serve")


def traffic_key(query: str, document: str) -> str:
    """One served pair's identity: the same (query, document) is logged once, however often it is served."""
    return hashlib.sha256(f"{query}\x00{document}".encode("utf-8", "replace")).hexdigest()


def append_traffic(store: Store, pairs: Sequence[tuple[str, str]]) -> int:
    """Write served (query, document) pairs as unlabelled traffic, deduplicated, while fewer than the
    store's ``max_traffic`` wait for the next round; returns the number of new rows."""
    with _live(store) as opened:
        room = opened.config.max_traffic
        with opened.transaction() as conn:  # the writer lock: replicas do not overfill the bound together
            t = db.live_traffic
            waiting = conn.execute(select(func.count()).select_from(t).where(t.c.round.is_(None))).scalar_one()
            written = 0
            for query, document in pairs:
                if waiting + written >= room:
                    break
                row = {"query": query, "document": document, "key": traffic_key(query, document), "added_at": _now()}
                written += insert_new(conn, t, row, "key")
            return written


def promote_traffic(store: Store) -> int | None:
    """Queue the traffic since the last promotion as one unlabelled round (CautiousDPO labels it);
    its id, or None when nothing new arrived."""
    with _live(store) as opened:
        template = opened.config.verdict_template()
        with opened.transaction() as conn:
            t = db.live_traffic
            waiting = select(t.c.id, t.c.query, t.c.document).where(t.c.round.is_(None)).order_by(t.c.id)
            rows = conn.execute(waiting).all()
            if not rows:
                return None
            rounds = [r[0] for r in conn.execute(union(select(db.examples.c.round), select(db.rounds.c.round)))]
            round_id = max([r + 1 for r in rounds] or [0])
            examples = []
            for rowid, query, document in rows:
                fields = {f: "" for f in template.fields}
                fields.update(template.fields_for(query, document))
                examples.append(LabeledPair(f"traffic-{rowid}", f"traffic-q:{traffic_key(query, '')[:16]}",
                                            query, document, -1, fields, group="traffic", dataset=template.name))
            opened._insert_examples(conn, examples, round_id)
            _mark_promoted(conn, t, [r[0] for r in rows], round_id)
        return round_id


class TrafficLog:
    """Served (query, documents) → the store's traffic table, off the request path.

    :meth:`record` only puts the request on a bounded in-memory queue (never waits; a full queue
    drops the request and counts it); one daemon thread writes what has queued up in one
    transaction per batch (:func:`append_traffic`). A write error is logged, never raised into
    a request.

    Example::

        traffic = TrafficLog("state/mine")
        traffic.record("who wrote hamlet", ["Shakespeare wrote Hamlet.", "Paris"])
        traffic.flush(); traffic.close()
    """

    def __init__(self, store: Store, max_queued: int = 1024, max_documents: int = 100):
        pending_feedback(store)  # a missing or damaged store fails at start-up, not in the writer
        self.store = store if isinstance(store, StoreLocation) else str(store)
        self.max_documents = max_documents  # per request: a 1,000-document request logs its first 100
        self.queue: queue.Queue = queue.Queue(maxsize=max_queued)
        self.dropped = 0
        self.written = 0
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name="ragsieve-traffic", daemon=True)
        self._thread.start()

    def record(self, query: str, documents: Sequence[str]) -> None:
        self._idle.clear()
        try:
            self.queue.put_nowait([(query, d) for d in documents[: self.max_documents]])
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while True:
            try:
                item = self.queue.get(timeout=0.2)
            except queue.Empty:
                self._idle.set()
                continue
            if item is None:
                self._idle.set()
                return
            batch = list(item)
            while len(batch) < 2000:
                try:
                    more = self.queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self.queue.put(None)  # seen after this batch is written
                    break
                batch += more
            try:
                self.written += append_traffic(self.store, batch)
            except Exception as exc:  # noqa: BLE001 - the service keeps serving; the log says why
                log.error("traffic log: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything recorded so far is written (tests; shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.queue.empty() and self._idle.is_set():
                return
            time.sleep(0.05)

    def close(self) -> None:
        self.flush()
        self.queue.put(None)
        self._thread.join(timeout=5)


def traffic_log(store: str | None, enabled: bool) -> TrafficLog | None:
    """The service's traffic log (``ragsieve serve --log-traffic``), which needs a feedback store."""
    if not enabled:
        return None
    if not store:
        raise DataError("--log-traffic needs --feedback-store (the evolve store the traffic goes to)")
    return TrafficLog(store)
