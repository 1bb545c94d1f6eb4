"""Deployment state of an evolving reranker, advanced a round at a time.

The store's rows (:mod:`ragsieve.evolve_db`: ``<store>/evolve.sqlite`` by default, or a
PostgreSQL database every serve replica writes to) hold the configuration (the verdict template
too, saved whole when it is the user's own file), the incoming examples by round (with hidden
gold labels when simulating from a benchmark, for the round log only), feedback labels, an
optional test split (``evolve init --test-size``), the replay buffer (every training pair with
its round and source: gold / self / jury), each round's verdicts of the model before it trained
on them (``verdicts``: what the labeller check judges the model by) and the round log;
``<store>/adapters/round-NNN`` holds each round's LoRA delta. The model after round t is the
base LLM with the deltas of rounds 0..t merged in order.

A store starts from the user's rows (:func:`init_store_from_examples`, ``evolve init
--examples``) or from a benchmark (:func:`init_store_from_dataset`, a simulation).
:func:`run_step` runs the next round: round 0 fine-tunes M0 on the labelled SFT set;
round t >= 1 trains M_t with the feedback method when every example of D_t has feedback,
else with CautiousDPO (self-labels + jury) after the labeller check (``judge_check``,
:func:`_check_labellers`): a labeller that does not clear chance on the labelled feedback
does not label, and with none left (and no feedback in D_t) the round is recorded as
``skipped`` with its reason. With a test split, M_t is scored on it after every round. All of
a round's rows (its pairs, verdicts and log entry) are written in ONE transaction at the end,
and the adapter folder is renamed into place before that; so a process killed at any moment
(kill -9 included) leaves either the whole round or none of it, and rerunning ``run_step``
redoes exactly the unfinished round: no pair is duplicated or lost. A file lock keeps two
steps from running at once.

Example::

    init_store_from_examples("state/mine", "labels.jsonl", EvolveStoreConfig(template="relevance"), test_size=100)
    run_step("state/mine")                 # round 0: M0
    add_feedback("state/fever", "labels.jsonl")   # gold labels of queued examples (a simulation's rounds)
    run_step("state/fever")                # round 1, a full-feedback round if labels.jsonl covers it
    store_status("state/mine")
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
from pydantic import Field
from sqlalchemy import func, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from ragsieve import evolve_db as db
from ragsieve.artifacts import STORE_REBUILD, damaged
from ragsieve.config import StrictConfig, build_config
from ragsieve.errors import DataError, RagsieveError
from ragsieve.evolve.judges import JudgeSpec
from ragsieve.evolve.methods import MethodConfig, Pair
from ragsieve.data.labelled import label_value, labelled_rows, numbered_rows
from ragsieve.data.records import LabeledPair
from ragsieve.evolve.train import VerdictTrainConfig
from ragsieve.models.specs import DEFAULT_LLM
from ragsieve.evolve_db import DB_FILE  # noqa: F401  (re-exported: the SQLite file's name, for callers)
from ragsieve.evolve_db import (
    StoreLocation, database_error, finished_adapters, insert_rows, is_database_url, locate_store, open_database,
    step_lock, store_config_json, store_exists, upsert, write_pointer, write_transaction,
)

if TYPE_CHECKING:
    from ragsieve.models.verdict import VerdictScores
    from ragsieve.prompts.verdicts import VerdictTemplate

class EvolveStoreConfig(StrictConfig):
    """How a deployed reranker evolves (saved in the store at ``init``)."""

    llm: str = DEFAULT_LLM
    template: str  # a template name of verdicts.yaml (`relevance` for a user's own rows), or a user file's stem
    template_spec: Optional[dict[str, str]] = None  # a user's template, saved whole (see verdicts.template_mapping)
    max_prompt_tokens: int = 320
    batch_size: int = 8
    # No feedback: CautiousDPO with replay; a full-feedback round: ReplayDPO on the gold pairs.
    # Balanced acceptance is on: unguarded self-labelling collapsed to one verdict on BioASQ at every tau
    # in 0.8-0.97 (n = 300); guarded, it ended +8.7 pp over the frozen M0 (results/evolve, p = 0.004).
    method: MethodConfig = MethodConfig(kind="cautious-dpo", alpha=0.7, tau=0.9, balance=True)
    feedback_method: MethodConfig = MethodConfig(kind="replay-dpo", alpha=0.7)
    judges: list[JudgeSpec] = []
    m0_train: VerdictTrainConfig = VerdictTrainConfig(lr=2e-4, epochs=2)
    train: VerdictTrainConfig = VerdictTrainConfig()
    seed: int = 0
    # Before a CautiousDPO round, each labeller (judge, and the model's confident verdicts) is
    # measured on the labelled feedback; one whose Wilson interval does not clear the majority
    # share does not label (see `check_labellers`). Off: the study's unguarded method.
    judge_check: bool = True
    # Served traffic (`ragsieve serve --log-traffic`) waiting for the next round, at most this many pairs.
    max_traffic: int = Field(1000, ge=1)

    def verdict_template(self) -> "VerdictTemplate":
        from ragsieve.prompts.verdicts import stored_template

        return stored_template(self.template, self.template_spec)


@dataclass
class StepReport:
    round: int | None  # None: nothing left to run
    mode: str = "idle"  # sft | cautious | feedback | skipped | idle
    record: dict[str, Any] | None = None
    seconds: float = 0.0

    def summary(self) -> str:
        """The one line `evolve step` prints per round: mode, examples, accepted labels, seconds, test accuracy."""
        rec = self.record or {}
        labels = rec.get("labels") or {}
        accepted = labels.get("accepted", rec.get("n_new_pairs", 0))
        line = (f"round {self.round} ({self.mode}): {rec.get('n_examples', labels.get('n', 0))} examples, "
                f"{accepted} accepted labels, {self.seconds:.1f}s")
        test = rec.get("test") or {}
        if test.get("accuracy") is not None:
            line += f", test accuracy {test['accuracy']:.3f} (n = {test['n']})"
        if rec.get("skipped"):
            line += f"; skipped: {rec['skipped']}"
        return line

    def check_line(self) -> str | None:
        """The labeller check of a CautiousDPO round, one line: each labeller's accuracy on the labelled
        feedback, its Wilson interval, the chance it had to clear and whether it labelled."""
        check = (self.record or {}).get("labeller_check")
        if not check:
            return None
        parts = []
        for r in check["labellers"]:
            acc = "no labels" if not r["n"] else (f"{r['accuracy']:.2f} [{r['low']:.2f}, {r['high']:.2f}] on {r['n']} "
                                                  f"vs chance {r['chance']:.2f}")
            parts.append(f"{r['labeller']} {acc}: {'used' if r['used'] else 'not used'}")
        return f"  labeller check on {check['n_labelled']} labelled feedback example(s): " + "; ".join(parts)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class EvolveStore:
    """The rows (SQLite file or PostgreSQL, :mod:`ragsieve.evolve_db`) and adapter folders of one
    deployment (see the module doc).

    Example::

        store = EvolveStore("state/fever")        # or EvolveStore(locate_store("state/fever", "postgresql://..."))
        store.round_log(), len(store.pairs()), store.adapters()
        store.close()
    """

    def __init__(self, store: "str | Path | StoreLocation", *, create: bool = False):
        self.location = locate_store(store)
        self.dir = self.location.dir  # None: a database URL alone (feedback and traffic need no folder)
        self.engine = open_database(self.location, create=create)

    def close(self) -> None:
        """Nothing stays open between calls (each read and write takes a pooled connection); kept for callers."""

    def _rows(self, stmt) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(stmt).all())

    def check(self) -> None:
        """Refuse a damaged SQLite file now (``PRAGMA quick_check``), not after minutes of training."""
        if self.location.postgres:
            return  # the server keeps its own pages consistent
        try:
            with self.engine.connect() as conn:
                problems = [r[0] for r in conn.exec_driver_sql("PRAGMA quick_check(1)")]
        except SQLAlchemyError as exc:
            raise database_error(self.location, exc) from None
        if problems != ["ok"]:
            # the report starts with a "*** in database main ***" banner; the next line says what
            lines = [line for line in str(problems[0]).splitlines() if line.strip() and not line.startswith("***")]
            raise damaged(self.location.label, f"integrity check: {(lines or ['failed'])[0]}", STORE_REBUILD)

    @contextmanager
    def transaction(self, *, lock: bool = True) -> Iterator[Connection]:
        """One write transaction under the store's writer lock (see :func:`ragsieve.evolve_db.write_transaction`)."""
        with write_transaction(self.engine, lock=lock) as conn:
            yield conn

    # -- configuration -------------------------------------------------------------
    @property
    def config(self) -> EvolveStoreConfig:
        with self.engine.connect() as conn:
            saved = store_config_json(conn, self.location.label)
        return build_config(EvolveStoreConfig, saved, source=f"{self.location.label}: config")

    # -- examples and feedback -----------------------------------------------------
    def add_examples(self, examples: Sequence[LabeledPair], round_id: int) -> None:
        with self.transaction() as conn:
            self._insert_examples(conn, examples, round_id)

    def _insert_examples(self, conn: Connection, examples: Sequence[LabeledPair], round_id: int) -> None:
        rows = [{"id": x.id, "round": round_id, "data": json.dumps(x.to_json(), ensure_ascii=False)} for x in examples]
        try:
            with conn.begin_nested():  # a savepoint: PostgreSQL refuses every statement after an error otherwise
                insert_rows(conn, db.examples, rows)
        except IntegrityError:
            known = {r[0] for r in conn.execute(select(db.examples.c.id))}
            seen: set[str] = set()
            dup = next((x.id for x in examples if x.id in known or x.id in seen or seen.add(x.id)), "?")
            raise DataError(f"example id '{dup}' is already in the store") from None

    def examples(self, round_id: int) -> list[LabeledPair]:
        t = db.examples
        rows = self._rows(select(t.c.data).where(t.c.round == round_id).order_by(t.c.seq))
        return [LabeledPair.from_json(json.loads(r[0])) for r in rows]

    def test_examples(self) -> list[LabeledPair]:
        """The store's test split (``evolve init --test-size``): scored after every round, never trained on."""
        rows = self._rows(select(db.test_examples.c.data).order_by(db.test_examples.c.seq))
        return [LabeledPair.from_json(json.loads(r[0])) for r in rows]

    def recorded_verdicts(self) -> dict[str, tuple[float, float]]:
        """M_{t-1}'s (logp_true, logp_false) on each example of round t, recorded before round t trained."""
        v, e = db.verdicts, db.examples
        rows = self._rows(
            select(v.c.example_id, v.c.logp_true, v.c.logp_false)
            .join(e, (e.c.id == v.c.example_id) & (e.c.round == v.c.round))
            .order_by(e.c.seq)
        )
        return {i: (float(t), float(f)) for i, t, f in rows}

    def example_rounds(self) -> list[int]:
        return [r[0] for r in self._rows(select(db.examples.c.round).distinct().order_by(db.examples.c.round))]

    def example_round_of(self) -> dict[str, int]:
        """Every example id → its round."""
        return dict(self._rows(select(db.examples.c.id, db.examples.c.round)))

    def set_feedback(self, labels: dict[str, int]) -> None:
        with self.transaction() as conn:
            upsert(conn, db.feedback, [{"example_id": i, "label": int(v), "added_at": _now()}
                                       for i, v in labels.items()], ["example_id"])

    def feedback(self, example_ids: Sequence[str]) -> dict[str, int]:
        wanted = set(example_ids)
        rows = self._rows(select(db.feedback.c.example_id, db.feedback.c.label))
        return {i: int(v) for i, v in rows if i in wanted}

    # -- rounds, adapters, replay buffer -------------------------------------------------
    def done_rounds(self) -> list[int]:
        return [r[0] for r in self._rows(select(db.rounds.c.round).order_by(db.rounds.c.round))]

    def next_round(self) -> int:
        done = self.done_rounds()
        return done[-1] + 1 if done else 0

    def adapter_dir(self, round_id: int) -> Path:
        return self.location.need_dir("an adapter") / "adapters" / f"round-{round_id:03d}"

    def adapters(self) -> list[Path]:
        """The deltas of the finished rounds, in order (rounds that trained nothing have none)."""
        folder = self.location.need_dir("the adapters")
        with self.engine.connect() as conn:
            return finished_adapters(conn, folder)

    def pairs(self, before_round: int | None = None) -> list[Pair]:
        """The replay buffer (optionally only rounds < ``before_round``), joined with the examples."""
        p, e = db.pairs, db.examples
        stmt = select(p.c.round, p.c.example_id, p.c.label, p.c.source, e.c.data).join(e, e.c.id == p.c.example_id)
        if before_round is not None:
            stmt = stmt.where(p.c.round < before_round)
        # sorted here, by code point: a PostgreSQL collation would order the ids (and so the replay draw) differently
        rows = sorted(self._rows(stmt), key=lambda r: (r[0], r[1]))
        return [
            Pair(LabeledPair.from_json(json.loads(data)), int(label), source, int(rnd))
            for rnd, _, label, source, data in rows
        ]

    def round_log(self) -> list[dict[str, Any]]:
        r = db.rounds
        rows = self._rows(select(r.c.round, r.c.mode, r.c.adapter, r.c.record, r.c.finished_at).order_by(r.c.round))
        return [
            {"round": n, "mode": m, "adapter": a, "finished_at": f, **json.loads(rec)} for n, m, a, rec, f in rows
        ]

    def commit_round(
        self, round_id: int, mode: str, adapter: Path | None, record: dict, pairs: Sequence[Pair],
        verdicts: tuple[Sequence[LabeledPair], "VerdictScores"] | None = None,
    ) -> None:
        """Write the round's pairs, M_{t-1}'s verdicts on its examples and its log entry in one transaction."""
        rel = str(adapter.relative_to(self.location.need_dir("an adapter"))) if adapter is not None else None
        with self.transaction() as conn:
            self._insert_pairs(conn, pairs)
            if verdicts is not None:
                examples, scores = verdicts
                upsert(conn, db.verdicts, [
                    {"example_id": x.id, "round": round_id, "logp_true": float(t), "logp_false": float(f)}
                    for x, t, f in zip(examples, scores.logp_true, scores.logp_false)
                ], ["example_id", "round"])
            insert_rows(conn, db.rounds, [{"round": round_id, "mode": mode, "adapter": rel,
                                           "record": json.dumps(record), "finished_at": _now()}])

    def _insert_pairs(self, conn: Connection, pairs: Sequence[Pair]) -> None:
        insert_rows(conn, db.pairs, [{"example_id": p.example.id, "round": p.round, "label": p.label,
                                      "source": p.source} for p in pairs])


# --------------------------------------------------------------------------- operations


@contextmanager
def _open(store: "str | Path | StoreLocation", *, create: bool = False) -> Iterator[EvolveStore]:
    """An open store; database errors (a page found corrupt mid-read, a server gone) become one line."""
    opened = EvolveStore(store, create=create)
    try:
        yield opened
    except SQLAlchemyError as exc:
        raise database_error(opened.location, exc) from None
    finally:
        opened.close()


def init_store(
    store: "str | Path | StoreLocation",
    config: EvolveStoreConfig,
    initial: Sequence[LabeledPair],
    rounds: Sequence[Sequence[LabeledPair]] = (),
    test: Sequence[LabeledPair] = (),
) -> "Path | str | StoreLocation":
    """Create a store: ``initial`` (labelled) becomes round 0, ``rounds`` the queued batches,
    ``test`` (labelled) the split scored after every round. Returns the store as given (a folder as a Path,
    a database URL as the string it was)."""
    config.verdict_template()  # fail now, not at the first step
    location = locate_store(store)
    if store_exists(location):
        where = "database" if location.postgres else "directory"
        raise RagsieveError(f"{location.label if location.postgres else location.dir} already holds an evolve "
                            f"store; use another {where}")
    if not initial or len({x.label for x in initial}) < 2:
        raise DataError("the initial SFT set needs labelled examples of both classes")
    if location.dir is not None:
        location.dir.mkdir(parents=True, exist_ok=True)
    with _open(location, create=True) as opened, opened.transaction() as conn:
        insert_rows(conn, db.meta, [{"key": "config", "value": config.model_dump_json()},
                                    {"key": "created", "value": _now()}])
        opened._insert_examples(conn, initial, 0)
        insert_rows(conn, db.feedback, [{"example_id": x.id, "label": int(x.label), "added_at": _now()}
                                        for x in initial])
        for t, batch in enumerate(rounds, start=1):
            opened._insert_examples(conn, batch, t)
        insert_rows(conn, db.test_examples, [{"id": x.id, "data": json.dumps(x.to_json(), ensure_ascii=False)}
                                             for x in test])
    write_pointer(location)
    # a URL stays a string: Path() would fold its "//" and name another thing
    return store if isinstance(store, StoreLocation) or is_database_url(store) else Path(store)


def init_store_from_dataset(
    store_dir: "str | Path | StoreLocation",
    dataset: str,
    config: EvolveStoreConfig,
    *,
    initial_size: int = 128,
    round_size: int = 64,
    rounds: int = 4,
    data_dir: str | None = None,
    test_size: int = 0,
) -> "Path | str | StoreLocation":
    """Simulate a deployment on a benchmark: its SFT set and rounds (gold hidden from training)."""
    from ragsieve.evolve.tasks import build_task_rounds

    task = build_task_rounds(
        dataset, initial_size=initial_size, round_size=round_size, rounds=rounds, seed=config.seed, data_dir=data_dir,
        test_size=test_size,
    )
    return init_store(store_dir, config, task.initial, task.rounds, task.test)


def read_labelled_examples(path: str | Path, template: "VerdictTemplate") -> list[LabeledPair]:
    """A user's rows ``{query, passage, label}`` (+ ``id``, ``query_id``, extra template slots);
    a bad row is one error naming ``file:line`` (:mod:`ragsieve.data.labelled`, the one reader).

    ``label`` is 0/1, true/false or one of the template's label words. Extra slots (a template
    with more than ``{query}`` and ``{passage}``) come from the row's keys of the same name.
    """
    out = []
    for where, row, pair in labelled_rows(path, _template_words(template)):
        fields = template.fields_for(pair.query, pair.passage)
        for slot in template.fields:
            if slot not in fields:
                if not isinstance(row.get(slot), str):
                    raise DataError(f"{where}: template '{template.name}' needs field '{slot}' (a string)")
                fields[slot] = row[slot]
        out.append(replace(pair, fields=fields, dataset=template.name))
    return out


def _template_words(template: "VerdictTemplate") -> dict[str, int]:
    return {template.true_word.lower(): 1, template.false_word.lower(): 0}


def init_store_from_examples(
    store_dir: "str | Path | StoreLocation", path: str | Path, config: EvolveStoreConfig, *, test_size: int = 0
) -> "tuple[Path | str | StoreLocation, int, int]":
    """Start a store from the user's labelled rows: all of them train M0 (round 0), but
    ``test_size`` examples of whole queries (balanced) held out as the test split.
    Returns the store, the SFT size and the test size."""
    from ragsieve.evolve.tasks import select_test

    examples = read_labelled_examples(path, config.verdict_template())
    test: list[LabeledPair] = []
    if test_size:
        test, used = select_test(examples, test_size, config.seed, True, str(path))
        examples = [x for x in examples if x.query_id not in used]
    return init_store(store_dir, config, examples, test=test), len(examples), len(test)


def ingest(store_dir: "str | Path | StoreLocation", path: str | Path) -> int:
    """Queue a new batch (one round) from jsonl rows ``{id, fields: {...}, label?}``; returns its round."""
    with _open(store_dir) as store:
        template = store.config.verdict_template()
        words = _template_words(template)
        batch = []
        for where, row in numbered_rows(path):
            fields = row.get("fields")
            if not isinstance(fields, dict) or any(f not in fields for f in template.fields):
                raise DataError(f"{where}: 'fields' must hold {list(template.fields)}")
            if "id" not in row:
                raise DataError(f"{where}: missing 'id'")
            label = label_value(row["label"], where, words) if row.get("label") is not None else -1
            batch.append(LabeledPair(
                str(row["id"]), str(row.get("query_id", row["id"])),
                str(fields[template.query_field]), str(fields[template.passage_field]), label,
                {k: str(v) for k, v in fields.items()}, dataset=template.name,
            ))
        round_id = max([store.next_round(), *[r + 1 for r in store.example_rounds()]])
        store.add_examples(batch, round_id)
        return round_id


def add_feedback(store_dir: "str | Path | StoreLocation", path: str | Path) -> dict[str, int]:
    """Record gold labels (jsonl ``{id, label}``, label 0/1 or a label word) for queued examples.

    A round whose examples all have feedback runs as a full-feedback round; partial
    feedback is used as gold inside a CautiousDPO round. Re-adding a label replaces it,
    so feeding the same file twice changes nothing. Labels for finished rounds are refused.
    """
    with _open(store_dir) as store:
        template = store.config.verdict_template()
        words = _template_words(template)
        round_of = store.example_round_of()
        first_open = store.next_round()
        labels: dict[str, int] = {}
        for where, row in numbered_rows(path):
            example_id = str(row.get("id", ""))
            if example_id not in round_of:
                raise DataError(f"{where}: unknown example id {example_id!r}")
            if round_of[example_id] < first_open:
                raise DataError(f"{where}: example {example_id!r} belongs to finished round {round_of[example_id]}")
            labels[example_id] = label_value(row.get("label"), where, words)
        store.set_feedback(labels)
        counts: dict[str, int] = {}
        for example_id in labels:
            key = f"round {round_of[example_id]}"
            counts[key] = counts.get(key, 0) + 1
        return counts


def run_step(store_dir: "str | Path | StoreLocation") -> StepReport:
    """Run the next round of the store (see the module doc); idle when none is queued."""
    from filelock import FileLock, Timeout

    location = EvolveStore(store_dir).location  # a missing store is an error before any lock file is made
    folder = location.need_dir("`evolve step` (it writes adapters)")
    try:
        with FileLock(str(folder / ".step.lock"), timeout=1):
            with _open(location) as store, step_lock(location, store.engine):
                store.check()
                return _run_next_round(store)
    except Timeout:
        raise RagsieveError(f"another `evolve step` is running on {folder}") from None


def _run_next_round(store: EvolveStore) -> StepReport:
    from ragsieve.evolve.methods import build_method, evolve_round, verdict_metrics
    from ragsieve.rerank.pointwise import PointwiseLLMReranker
    from ragsieve.evolve.train import train_round

    start = time.perf_counter()
    cfg = store.config
    round_id = store.next_round()
    examples = store.examples(round_id)
    if not examples:
        return StepReport(None)
    ranker = PointwiseLLMReranker(
        cfg.verdict_template(), cfg.llm, adapters=store.adapters(), max_prompt_tokens=cfg.max_prompt_tokens,
        batch_size=cfg.batch_size,
    )
    labels = store.feedback([x.id for x in examples])
    adapter = store.adapter_dir(round_id)
    before = None  # M_{t-1}'s verdicts on D_t, kept for later labeller checks
    if round_id == 0:
        mode = "sft"
        pairs = [Pair(x, labels[x.id], "gold", 0) for x in examples if x.id in labels]
        result = train_round(
            ranker.llm, ranker.tokens, "sft", ranker.prompts([p.example for p in pairs]), [p.label for p in pairs],
            cfg.m0_train.model_copy(update={"seed": cfg.seed}), save_dir=adapter,
        )
        result.truncated_passages = ranker.prompter.truncated  # a fresh ranker: only these prompts
        record: dict[str, Any] = {"n_new_pairs": len(pairs), "labels": {"n": len(examples), "accepted": len(pairs)},
                                  "train": result.summary()}
        trained = result.steps > 0
    else:
        full_feedback = len(labels) == len(examples)
        mode = "feedback" if full_feedback else "cautious"
        method_cfg = cfg.feedback_method if full_feedback else cfg.method
        before = ranker.predict(examples)
        judges, check = [], None
        if method_cfg.kind == "cautious-dpo":
            judges = _calibrated_judges(store, cfg, ranker.template) if method_cfg.jury else []
            if cfg.judge_check:
                check, judges, trust_self = _check_labellers(store, cfg, judges, examples, before, method_cfg.tau)
                if not judges:  # no checked judge: an unconfident model's own vote is not checked either
                    method_cfg = method_cfg.model_copy(update={"jury": False})
                if not judges and not trust_self and not labels:
                    reason = (f"no labeller clears chance on {check['n_labelled']} labelled feedback example(s)"
                              if check["n_labelled"] else
                              "no labelled feedback yet to check the labellers on (post some to /v1/feedback)")
                    record = {"round": round_id, **verdict_metrics(examples, before), "n_examples": len(examples),
                              "labels": {"n": len(examples), "accepted": 0}, "n_new_pairs": 0,
                              "labeller_check": check, "skipped": reason}
                    store.commit_round(round_id, "skipped", None, record, [], (examples, before))
                    return StepReport(round_id, "skipped", record, time.perf_counter() - start)
        method = build_method(method_cfg, judges)
        if check is not None:
            method.trust_self = trust_self  # type: ignore[attr-defined]
        history = store.pairs(before_round=round_id)
        rec, pairs = evolve_round(
            ranker, method, examples, history, round_id=round_id, labels=labels, train_config=cfg.train,
            save_dir=adapter, seed=cfg.seed, verdicts=before,
        )
        record = rec.to_json()
        if check is not None:
            record["labeller_check"] = check
        trained = bool(rec.train.get("steps"))
    record["n_examples"] = len(examples)
    test = store.test_examples()
    if test:  # M_t on the test split (never trained on)
        record["test"] = verdict_metrics(test, ranker.predict(test))
    store.commit_round(round_id, mode, adapter if trained else None, record, pairs,
                       (examples, before) if before is not None else None)
    return StepReport(round_id, mode, record, time.perf_counter() - start)


def _calibrated_judges(store: EvolveStore, cfg: EvolveStoreConfig, template: "VerdictTemplate") -> list:
    """The configured judges, thresholds calibrated on the labelled SFT set (the only labels CautiousDPO may use)."""
    from ragsieve.evolve.judges import build_judges

    if not cfg.judges:
        return []
    judges = build_judges(cfg.judges, template)
    initial = store.examples(0)
    gold0 = store.feedback([x.id for x in initial])
    calibration = [replace(x, label=gold0[x.id]) for x in initial if x.id in gold0]
    for judge in judges:
        judge.calibrate(calibration)
    return judges


def _check_labellers(
    store: EvolveStore, cfg: EvolveStoreConfig, judges: list, examples: Sequence[LabeledPair],
    verdicts: "VerdictScores", tau: float,
) -> tuple[dict[str, Any], list, bool]:
    """The labeller check (:func:`ragsieve.evolve.judges.check_labellers`) on the store's labelled feedback.

    The labels are every gold label past round 0 (live feedback rounds, ``evolve feedback`` on
    queued examples, this round's partial feedback): round 0 trained M0 and calibrated the
    judges, so it would flatter both. The model is judged by its verdicts from before it
    trained on each label (recorded per round), or by M_{t-1}'s on this round's examples.
    Returns the record, the judges that passed and whether the model's confident verdicts did.
    """
    from ragsieve.evolve.judges import SELF_LABELLER, check_labellers

    f, e = db.feedback, db.examples
    rows = store._rows(
        select(e.c.data, f.c.label).join(e, e.c.id == f.c.example_id).where(e.c.round >= 1).order_by(e.c.round, e.c.seq)
    )
    labelled = [replace(LabeledPair.from_json(json.loads(data)), label=int(label)) for data, label in rows]
    from ragsieve.models.verdict import VerdictScores

    recorded = store.recorded_verdicts()
    earlier = VerdictScores(np.array([v[0] for v in recorded.values()]), np.array([v[1] for v in recorded.values()]))
    own = {i: (int(p), float(c)) for i, p, c in zip(recorded, earlier.predictions, earlier.confidence)}
    own.update({x.id: (int(p), float(c)) for x, p, c in zip(examples, verdicts.predictions, verdicts.confidence)})
    check = check_labellers(labelled, judges, own, tau)
    passed = [j for j in judges if j.name in check["used"]]
    return check, passed, SELF_LABELLER in check["used"]


def store_status(store_dir: "str | Path | StoreLocation") -> dict[str, Any]:
    """Configuration, finished rounds (the log), queued rounds and the replay buffer by source."""
    with _open(store_dir) as store:
        cfg = store.config
        done = store.done_rounds()
        queued = [r for r in store.example_rounds() if r not in set(done)]
        e, f, p = db.examples, db.feedback, db.pairs
        sizes = dict(store._rows(select(e.c.round, func.count()).group_by(e.c.round)))
        fb = dict(store._rows(select(e.c.round, func.count()).join(f, e.c.id == f.c.example_id).group_by(e.c.round)))
        buffer = store._rows(
            select(p.c.round, p.c.source, func.count()).group_by(p.c.round, p.c.source).order_by(p.c.round, p.c.source)
        )
        return {
            "store": str(store.dir) if store.dir is not None else store.location.label,
            "database": store.location.label if store.location.postgres else None,
            "llm": cfg.llm,
            "template": cfg.template,
            "test_examples": store._rows(select(func.count()).select_from(db.test_examples))[0][0],
            "next_round": store.next_round() if queued else None,
            "rounds": store.round_log(),
            "queued": [{"round": r, "examples": sizes.get(r, 0), "feedback": fb.get(r, 0)} for r in queued],
            "replay_buffer": [{"round": r, "source": s, "pairs": n} for r, s, n in buffer],
        }
