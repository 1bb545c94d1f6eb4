"""Deployment state of an evolving reranker in one SQLite file, advanced a round at a time.

``<store>/evolve.sqlite`` holds the configuration (the verdict template too, saved whole when
it is the user's own file), the incoming examples by round (with hidden gold labels when
simulating from a benchmark, for the round log only), feedback labels, an optional test split
(``evolve init --test-size``), the replay buffer (every training pair with its round and
source: gold / self / jury), each round's verdicts of the model before it trained on them
(``verdicts``: what the labeller check judges the model by) and the round log;
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
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
from pydantic import Field

from ragsieve.artifacts import STORE_REBUILD, damaged, sqlite_error
from ragsieve.config import StrictConfig, build_config
from ragsieve.errors import DataError, RagsieveError
from ragsieve.evolve.judges import JudgeSpec
from ragsieve.evolve.methods import MethodConfig, Pair
from ragsieve.data.records import LabeledPair
from ragsieve.evolve.train import VerdictTrainConfig
from ragsieve.models.specs import DEFAULT_LLM
from ragsieve.rerank.evolving import DB_FILE, finished_adapters, missing_store, store_config_json

if TYPE_CHECKING:
    from ragsieve.models.verdict import VerdictScores
    from ragsieve.prompts.verdicts import VerdictTemplate

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS examples (
    id TEXT PRIMARY KEY, round INTEGER NOT NULL, data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS examples_round ON examples(round);
CREATE TABLE IF NOT EXISTS feedback (
    example_id TEXT PRIMARY KEY, label INTEGER NOT NULL, added_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pairs (
    example_id TEXT NOT NULL, round INTEGER NOT NULL, label INTEGER NOT NULL, source TEXT NOT NULL,
    PRIMARY KEY (example_id, round)
);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY, mode TEXT NOT NULL, adapter TEXT, record TEXT NOT NULL, finished_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS test_examples (id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS verdicts (
    example_id TEXT NOT NULL, round INTEGER NOT NULL, logp_true REAL NOT NULL, logp_false REAL NOT NULL,
    PRIMARY KEY (example_id, round)
);
"""


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
    """The SQLite file and adapter folders of one deployment (see the module doc).

    Example::

        store = EvolveStore("state/fever")
        store.round_log(), len(store.pairs()), store.adapters()
        store.close()
    """

    def __init__(self, store_dir: str | Path, *, create: bool = False):
        self.dir = Path(store_dir)
        path = self.dir / DB_FILE
        if self.dir.is_file():
            raise RagsieveError(f"{self.dir}: is a file; give the evolve store folder (the one holding {DB_FILE})")
        if not path.is_file() and not create:
            raise missing_store(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        # autocommit mode; multi-statement writes use explicit transactions (see `transaction`)
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=60)
        try:
            self.conn.execute("PRAGMA journal_mode=WAL")  # the first read: a non-database fails here
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            self.conn.close()
            raise sqlite_error(path, exc, STORE_REBUILD) from None

    def close(self) -> None:
        self.conn.close()

    def check(self) -> None:
        """Refuse a damaged file now (``PRAGMA quick_check``), not after minutes of training."""
        try:
            problems = [r[0] for r in self.conn.execute("PRAGMA quick_check(1)")]
        except sqlite3.Error as exc:
            raise sqlite_error(self.dir / DB_FILE, exc, STORE_REBUILD) from None
        if problems != ["ok"]:
            # the report starts with a "*** in database main ***" banner; the next line says what
            lines = [line for line in str(problems[0]).splitlines() if line.strip() and not line.startswith("***")]
            raise damaged(self.dir / DB_FILE, f"integrity check: {(lines or ['failed'])[0]}", STORE_REBUILD)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # -- configuration -------------------------------------------------------------
    @property
    def config(self) -> EvolveStoreConfig:
        source = f"{self.dir / DB_FILE}: config"
        return build_config(EvolveStoreConfig, store_config_json(self.conn, self.dir), source=source)

    # -- examples and feedback -----------------------------------------------------
    def add_examples(self, examples: Sequence[LabeledPair], round_id: int) -> None:
        with self.transaction() as conn:
            self._insert_examples(conn, examples, round_id)

    def _insert_examples(self, conn: sqlite3.Connection, examples: Sequence[LabeledPair], round_id: int) -> None:
        try:
            conn.executemany(
                "INSERT INTO examples (id, round, data) VALUES (?, ?, ?)",
                [(x.id, round_id, json.dumps(x.to_json(), ensure_ascii=False)) for x in examples],
            )
        except sqlite3.IntegrityError:
            known = {r[0] for r in conn.execute("SELECT id FROM examples")}
            dup = next((x.id for x in examples if x.id in known), "?")
            raise DataError(f"example id '{dup}' is already in the store") from None

    def examples(self, round_id: int) -> list[LabeledPair]:
        rows = self.conn.execute("SELECT data FROM examples WHERE round = ? ORDER BY rowid", (round_id,))
        return [LabeledPair.from_json(json.loads(r[0])) for r in rows]

    def test_examples(self) -> list[LabeledPair]:
        """The store's test split (``evolve init --test-size``): scored after every round, never trained on."""
        rows = self.conn.execute("SELECT data FROM test_examples ORDER BY rowid")
        return [LabeledPair.from_json(json.loads(r[0])) for r in rows]

    def recorded_verdicts(self) -> dict[str, tuple[float, float]]:
        """M_{t-1}'s (logp_true, logp_false) on each example of round t, recorded before round t trained."""
        rows = self.conn.execute(
            "SELECT v.example_id, v.logp_true, v.logp_false FROM verdicts v JOIN examples e"
            " ON e.id = v.example_id AND e.round = v.round"
        )
        return {i: (float(t), float(f)) for i, t, f in rows}

    def example_rounds(self) -> list[int]:
        return [r[0] for r in self.conn.execute("SELECT DISTINCT round FROM examples ORDER BY round")]

    def set_feedback(self, labels: dict[str, int]) -> None:
        with self.transaction() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO feedback (example_id, label, added_at) VALUES (?, ?, ?)",
                [(i, int(v), _now()) for i, v in labels.items()],
            )

    def feedback(self, example_ids: Sequence[str]) -> dict[str, int]:
        wanted = set(example_ids)
        return {i: int(v) for i, v in self.conn.execute("SELECT example_id, label FROM feedback") if i in wanted}

    # -- rounds, adapters, replay buffer -------------------------------------------------
    def done_rounds(self) -> list[int]:
        return [r[0] for r in self.conn.execute("SELECT round FROM rounds ORDER BY round")]

    def next_round(self) -> int:
        done = self.done_rounds()
        return done[-1] + 1 if done else 0

    def adapter_dir(self, round_id: int) -> Path:
        return self.dir / "adapters" / f"round-{round_id:03d}"

    def adapters(self) -> list[Path]:
        """The deltas of the finished rounds, in order (rounds that trained nothing have none)."""
        return finished_adapters(self.conn, self.dir)

    def pairs(self, before_round: int | None = None) -> list[Pair]:
        """The replay buffer (optionally only rounds < ``before_round``), joined with the examples."""
        sql = (
            "SELECT p.round, p.label, p.source, e.data FROM pairs p JOIN examples e ON e.id = p.example_id"
            + (" WHERE p.round < ?" if before_round is not None else "")
            + " ORDER BY p.round, p.example_id"
        )
        args = (before_round,) if before_round is not None else ()
        return [
            Pair(LabeledPair.from_json(json.loads(data)), int(label), source, int(rnd))
            for rnd, label, source, data in self.conn.execute(sql, args)
        ]

    def round_log(self) -> list[dict[str, Any]]:
        rows = self.conn.execute("SELECT round, mode, adapter, record, finished_at FROM rounds ORDER BY round")
        return [
            {"round": r, "mode": m, "adapter": a, "finished_at": f, **json.loads(rec)} for r, m, a, rec, f in rows
        ]

    def commit_round(
        self, round_id: int, mode: str, adapter: Path | None, record: dict, pairs: Sequence[Pair],
        verdicts: tuple[Sequence[LabeledPair], "VerdictScores"] | None = None,
    ) -> None:
        """Write the round's pairs, M_{t-1}'s verdicts on its examples and its log entry in one transaction."""
        rel = str(adapter.relative_to(self.dir)) if adapter is not None else None
        with self.transaction() as conn:
            self._insert_pairs(conn, pairs)
            if verdicts is not None:
                examples, scores = verdicts
                conn.executemany(
                    "INSERT OR REPLACE INTO verdicts (example_id, round, logp_true, logp_false) VALUES (?, ?, ?, ?)",
                    [(x.id, round_id, float(t), float(f))
                     for x, t, f in zip(examples, scores.logp_true, scores.logp_false)],
                )
            conn.execute(
                "INSERT INTO rounds (round, mode, adapter, record, finished_at) VALUES (?, ?, ?, ?, ?)",
                (round_id, mode, rel, json.dumps(record), _now()),
            )

    def _insert_pairs(self, conn: sqlite3.Connection, pairs: Sequence[Pair]) -> None:
        conn.executemany(
            "INSERT INTO pairs (example_id, round, label, source) VALUES (?, ?, ?, ?)",
            [(p.example.id, p.round, p.label, p.source) for p in pairs],
        )


# --------------------------------------------------------------------------- operations


@contextmanager
def _open(store_dir: str | Path, *, create: bool = False) -> Iterator[EvolveStore]:
    """An open store, closed afterwards; SQLite errors (a page found corrupt mid-read) become one line."""
    store = EvolveStore(store_dir, create=create)
    try:
        yield store
    except sqlite3.Error as exc:
        raise sqlite_error(store.dir / DB_FILE, exc, STORE_REBUILD) from None
    finally:
        store.close()


def init_store(
    store_dir: str | Path,
    config: EvolveStoreConfig,
    initial: Sequence[LabeledPair],
    rounds: Sequence[Sequence[LabeledPair]] = (),
    test: Sequence[LabeledPair] = (),
) -> Path:
    """Create a store: ``initial`` (labelled) becomes round 0, ``rounds`` the queued batches,
    ``test`` (labelled) the split scored after every round."""
    config.verdict_template()  # fail now, not at the first step
    if (Path(store_dir) / DB_FILE).is_file():
        raise RagsieveError(f"{store_dir} already holds an evolve store; use another directory")
    if not initial or len({x.label for x in initial}) < 2:
        raise DataError("the initial SFT set needs labelled examples of both classes")
    with _open(store_dir, create=True) as store, store.transaction() as conn:
        conn.execute("INSERT INTO meta (key, value) VALUES ('config', ?)", (config.model_dump_json(),))
        conn.execute("INSERT INTO meta (key, value) VALUES ('created', ?)", (_now(),))
        store._insert_examples(conn, initial, 0)
        conn.executemany(
            "INSERT INTO feedback (example_id, label, added_at) VALUES (?, ?, ?)",
            [(x.id, int(x.label), _now()) for x in initial],
        )
        for t, batch in enumerate(rounds, start=1):
            store._insert_examples(conn, batch, t)
        conn.executemany(
            "INSERT INTO test_examples (id, data) VALUES (?, ?)",
            [(x.id, json.dumps(x.to_json(), ensure_ascii=False)) for x in test],
        )
    return Path(store_dir)


def init_store_from_dataset(
    store_dir: str | Path,
    dataset: str,
    config: EvolveStoreConfig,
    *,
    initial_size: int = 128,
    round_size: int = 64,
    rounds: int = 4,
    data_dir: str | None = None,
    test_size: int = 0,
) -> Path:
    """Simulate a deployment on a benchmark: its SFT set and rounds (gold hidden from training)."""
    from ragsieve.evolve.tasks import build_task_rounds

    task = build_task_rounds(
        dataset, initial_size=initial_size, round_size=round_size, rounds=rounds, seed=config.seed, data_dir=data_dir,
        test_size=test_size,
    )
    return init_store(store_dir, config, task.initial, task.rounds, task.test)


def read_labelled_examples(path: str | Path, template: "VerdictTemplate") -> list[LabeledPair]:
    """A user's rows ``{query, passage, label}`` (+ ``id``, ``query_id``, extra template slots);
    a bad row is one error naming ``file:line``.

    ``label`` is 0/1, true/false or one of the template's label words. Extra slots (a template
    with more than ``{query}`` and ``{passage}``) come from the row's keys of the same name.
    """
    words = {template.true_word.lower(): 1, template.false_word.lower(): 0, "true": 1, "false": 0}
    out, seen = [], set()
    for where, row in _read_rows(path):
        for key in ("query", "passage"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise DataError(f"{where}: '{key}' must be a non-empty string")
        if "label" not in row:
            raise DataError(f"{where}: missing 'label' (0/1 or {template.true_word}/{template.false_word})")
        fields = template.fields_for(row["query"], row["passage"])
        for slot in template.fields:
            if slot not in fields:
                if not isinstance(row.get(slot), str):
                    raise DataError(f"{where}: template '{template.name}' needs field '{slot}' (a string)")
                fields[slot] = row[slot]
        example_id = str(row.get("id", f"row-{where.rsplit(':', 1)[1]}"))
        if example_id in seen:
            raise DataError(f"{where}: duplicate id {example_id!r}")
        seen.add(example_id)
        out.append(LabeledPair(
            example_id, str(row.get("query_id", row["query"])), row["query"], row["passage"],
            _label_value(row["label"], where, words), fields, dataset=template.name,
        ))
    return out


def init_store_from_examples(
    store_dir: str | Path, path: str | Path, config: EvolveStoreConfig, *, test_size: int = 0
) -> tuple[Path, int, int]:
    """Start a store from the user's labelled rows: all of them train M0 (round 0), but
    ``test_size`` examples of whole queries (balanced) held out as the test split.
    Returns the store, the SFT size and the test size."""
    from ragsieve.evolve.tasks import select_test

    examples = read_labelled_examples(path, config.verdict_template())
    test: list[LabeledPair] = []
    if test_size:
        test, used = select_test(examples, test_size, config.seed, True, str(path))
        examples = [x for x in examples if x.query_id not in used]
    init_store(store_dir, config, examples, test=test)
    return Path(store_dir), len(examples), len(test)


def _read_rows(path: str | Path) -> list[tuple[str, dict]]:
    from ragsieve.data import read_jsonl

    rows = [(f"{path}:{n}", row) for n, row in read_jsonl(path).numbered()]
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def _label_value(value: Any, where: str, words: dict[str, int]) -> int:
    if isinstance(value, bool) or value in (0, 1):
        return int(value)
    if isinstance(value, str) and value.strip().lower() in words:
        return words[value.strip().lower()]
    raise DataError(f"{where}: label {value!r} is not 0/1 or a label word ({', '.join(words)})")


def ingest(store_dir: str | Path, path: str | Path) -> int:
    """Queue a new batch (one round) from jsonl rows ``{id, fields: {...}, label?}``; returns its round."""
    with _open(store_dir) as store:
        template = store.config.verdict_template()
        words = {template.true_word.lower(): 1, template.false_word.lower(): 0}
        batch = []
        for where, row in _read_rows(path):
            fields = row.get("fields")
            if not isinstance(fields, dict) or any(f not in fields for f in template.fields):
                raise DataError(f"{where}: 'fields' must hold {list(template.fields)}")
            if "id" not in row:
                raise DataError(f"{where}: missing 'id'")
            label = _label_value(row["label"], where, words) if row.get("label") is not None else -1
            batch.append(LabeledPair(
                str(row["id"]), str(row.get("query_id", row["id"])),
                str(fields[template.query_field]), str(fields[template.passage_field]), label,
                {k: str(v) for k, v in fields.items()}, dataset=template.name,
            ))
        round_id = max([store.next_round(), *[r + 1 for r in store.example_rounds()]])
        store.add_examples(batch, round_id)
        return round_id


def add_feedback(store_dir: str | Path, path: str | Path) -> dict[str, int]:
    """Record gold labels (jsonl ``{id, label}``, label 0/1 or a label word) for queued examples.

    A round whose examples all have feedback runs as a full-feedback round; partial
    feedback is used as gold inside a CautiousDPO round. Re-adding a label replaces it,
    so feeding the same file twice changes nothing. Labels for finished rounds are refused.
    """
    with _open(store_dir) as store:
        template = store.config.verdict_template()
        words = {template.true_word.lower(): 1, template.false_word.lower(): 0}
        round_of = dict(store.conn.execute("SELECT id, round FROM examples"))
        first_open = store.next_round()
        labels: dict[str, int] = {}
        for where, row in _read_rows(path):
            example_id = str(row.get("id", ""))
            if example_id not in round_of:
                raise DataError(f"{where}: unknown example id {example_id!r}")
            if round_of[example_id] < first_open:
                raise DataError(f"{where}: example {example_id!r} belongs to finished round {round_of[example_id]}")
            labels[example_id] = _label_value(row.get("label"), where, words)
        store.set_feedback(labels)
        counts: dict[str, int] = {}
        for example_id in labels:
            key = f"round {round_of[example_id]}"
            counts[key] = counts.get(key, 0) + 1
        return counts


def run_step(store_dir: str | Path) -> StepReport:
    """Run the next round of the store (see the module doc); idle when none is queued."""
    from filelock import FileLock, Timeout

    store_dir = Path(store_dir)
    EvolveStore(store_dir).close()  # a missing store is an error before any lock file is made
    try:
        with FileLock(str(store_dir / ".step.lock"), timeout=1):
            with _open(store_dir) as store:
                store.check()
                return _run_next_round(store)
    except Timeout:
        raise RagsieveError(f"another `evolve step` is running on {store_dir}") from None


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

    rows = store.conn.execute(
        "SELECT e.data, f.label FROM feedback f JOIN examples e ON e.id = f.example_id WHERE e.round >= 1"
        " ORDER BY e.round, e.rowid"
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


def store_status(store_dir: str | Path) -> dict[str, Any]:
    """Configuration, finished rounds (the log), queued rounds and the replay buffer by source."""
    with _open(store_dir) as store:
        cfg = store.config
        done = store.done_rounds()
        queued = [r for r in store.example_rounds() if r not in set(done)]
        sizes = dict(store.conn.execute("SELECT round, COUNT(*) FROM examples GROUP BY round"))
        fb = dict(
            store.conn.execute(
                "SELECT e.round, COUNT(*) FROM feedback f JOIN examples e ON e.id = f.example_id GROUP BY e.round"
            )
        )
        buffer = store.conn.execute("SELECT round, source, COUNT(*) FROM pairs GROUP BY round, source ORDER BY round")
        return {
            "store": str(store.dir),
            "llm": cfg.llm,
            "template": cfg.template,
            "test_examples": store.conn.execute("SELECT COUNT(*) FROM test_examples").fetchone()[0],
            "next_round": store.next_round() if queued else None,
            "rounds": store.round_log(),
            "queued": [{"round": r, "examples": sizes.get(r, 0), "feedback": fb.get(r, 0)} for r in queued],
            "replay_buffer": [{"round": r, "source": s, "pairs": n} for r, s, n in buffer],
        }
