"""The evolve / feedback store on both backends (issue #43, part 1): the embedded SQLite file and a
real PostgreSQL started in a temporary folder (tools/postgres.py). The same tests run on each:
rows and their order, feedback ahead of unlabelled rounds, traffic, concurrent writer processes,
a writer killed mid-transaction; then what only one backend has (old SQLite stores migrated,
``--db`` and ``postgresql://`` store names, serve and ``evolve step`` on PostgreSQL).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest

from ragsieve.errors import DataError, RagsieveError
from tests.conftest import REPO

ROWS = [
    ("is it the fox?", "the fox jumps over the lazy dog", 1),
    ("is it the fox?", "the dog sleeps in the sun", 0),
    ("who wrote hamlet?", "William Shakespeare wrote Hamlet.", 1),
    ("who wrote hamlet?", "Paris is the capital of France.", 0),
]


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request, tmp_path):
    """Where a test's store lives: a folder with its SQLite file, or a folder + its own PostgreSQL database."""
    from ragsieve.evolve_db import close_engines, locate_store

    if request.param == "sqlite":
        yield locate_store(tmp_path / "store")
        return
    server = request.getfixturevalue("postgres")
    yield locate_store(tmp_path / "store", server.new_database())
    close_engines()  # no idle connections pile up on the session's server


def _pair(i, query, passage, label):
    from ragsieve.data.records import LabeledPair
    from ragsieve.prompts.verdicts import get_template

    return LabeledPair(f"x{i}", query, query, passage, label, get_template("relevance").fields_for(query, passage),
                       dataset="relevance")


def make_store(where, **config):
    """A store on the relevance template: ROWS as round 0 (ids out of sort order) and a queued unlabelled round."""
    from ragsieve.evolve.store import EvolveStoreConfig, init_store

    initial = [_pair(9 - i, q, p, y) for i, (q, p, y) in enumerate(ROWS)]  # x9, x8, ...: order is insertion order
    queued = [_pair(100 + i, "q", f"d{i}", -1) for i in range(3)]
    return init_store(where, EvolveStoreConfig(template="relevance", **config), initial, [queued])


def _script(body: str) -> list[str]:
    return [sys.executable, "-c", "import sys\nsys.path.insert(0, sys.argv[1])\n" + body, str(REPO)]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _store_arg(where) -> list[str]:
    """A store as two command-line words for a child process: the folder and the database URL ('' for SQLite)."""
    return [str(where.dir), where.url or ""]


_OPEN = "from ragsieve.evolve_db import locate_store\nstore = locate_store(sys.argv[2], sys.argv[3] or None)\n"


# --------------------------------------------------------------------------- the same tests on both backends


def test_rows_round_trip_in_insertion_order(location):
    from ragsieve.evolve.methods import Pair
    from ragsieve.evolve.store import EvolveStore, store_status
    from ragsieve.models.verdict import VerdictScores
    import numpy as np

    make_store(location)
    with pytest.raises(RagsieveError, match="already holds an evolve store"):
        make_store(location)
    s = EvolveStore(location)
    assert [x.id for x in s.examples(0)] == ["x9", "x8", "x7", "x6"] and len(s.examples(1)) == 3
    assert s.config.template == "relevance" and s.next_round() == 0
    with pytest.raises(DataError, match="example id 'x9' is already in the store"):
        s.add_examples([_pair(50, "q", "new", -1), _pair(9, "q", "again", -1)], 2)
    assert s.example_rounds() == [0, 1]  # the refused batch wrote nothing
    s.set_feedback({"x100": 1})
    s.set_feedback({"x100": 0, "x101": 1})  # replaces, never duplicates
    assert s.feedback(["x100", "x101", "x102"]) == {"x100": 0, "x101": 1}

    examples = s.examples(0)
    pairs = [Pair(x, x.label, "gold", 0) for x in examples]
    scores = VerdictScores(np.array([-0.1, -2.0, -0.2, -3.0]), np.array([-2.0, -0.1, -3.0, -0.2]))
    adapter = location.dir / "adapters" / "round-000"
    s.commit_round(0, "sft", adapter, {"n_new_pairs": 4}, pairs, (examples, scores))
    assert s.adapters() == [adapter] and s.done_rounds() == [0] and s.next_round() == 1
    assert [(p.example.id, p.label, p.source) for p in s.pairs()] == sorted(
        (x.id, x.label, "gold") for x in examples)
    assert s.pairs(before_round=0) == []
    assert s.recorded_verdicts()["x9"] == pytest.approx((-0.1, -2.0))
    log = s.round_log()
    assert log[0]["mode"] == "sft" and log[0]["adapter"] == "adapters/round-000" and log[0]["n_new_pairs"] == 4
    with pytest.raises(Exception):  # a round is finished once
        s.commit_round(0, "sft", None, {}, [])
    status = store_status(location)
    assert status["queued"] == [{"round": 1, "examples": 3, "feedback": 2}]
    assert status["replay_buffer"] == [{"round": 0, "source": "gold", "pairs": 4}]
    assert status["database"] == (location.label if location.postgres else None)


def test_feedback_goes_ahead_of_unlabelled_rounds_and_traffic_queues_last(location):
    from ragsieve.evolve.live import (FeedbackItem, TrafficLog, append_feedback, append_traffic, pending_feedback,
                                      promote_feedback, promote_traffic)
    from ragsieve.evolve.store import EvolveStore, store_status

    make_store(location, max_traffic=4)
    EvolveStore(location).commit_round(0, "sft", None, {}, [])  # round 0 ran: not what is tested here
    assert append_feedback(location, [FeedbackItem(query="q", document="good", label=1)]) == 1
    assert pending_feedback(location) == 1
    assert promote_feedback(location) == 1  # ahead of the queued unlabelled round, which moves back
    assert promote_feedback(location) is None and pending_feedback(location) == 0
    log = TrafficLog(location)
    log.record("q1", ["a", "b"])
    log.record("q1", ["a", "b", "c"])  # a and b again: logged once
    log.flush()
    log.record("q2", ["d", "e", "f"])  # one slot left before the next round
    log.close()
    assert (log.written, log.dropped) == (4, 0)
    assert append_traffic(location, [("q3", "g")]) == 0  # full
    assert promote_traffic(location) == 3  # traffic queues last
    append_feedback(location, [FeedbackItem(query="q", chosen="a", rejected="b", source="ui")])
    assert promote_feedback(location) == 2  # after the earlier feedback round, before both unlabelled rounds
    assert store_status(location)["queued"] == [
        {"round": 1, "examples": 1, "feedback": 1}, {"round": 2, "examples": 2, "feedback": 2},
        {"round": 3, "examples": 3, "feedback": 0}, {"round": 4, "examples": 4, "feedback": 0}]
    s = EvolveStore(location)
    assert [(x.query, x.passage, x.label) for x in s.examples(2)] == [("q", "a", 1), ("q", "b", 0)]
    assert s.examples(2)[0].query_id == s.examples(2)[1].query_id  # the preference's two rows stay a pair
    assert [(x.query, x.passage, x.label) for x in s.examples(4)][0] == ("q1", "a", -1)


_WRITER = _OPEN + """
from ragsieve.evolve.live import FeedbackItem, append_feedback, append_traffic
kind, w, n = sys.argv[4], sys.argv[5], int(sys.argv[6])
for i in range(n):
    if kind == "feedback":
        append_feedback(store, [FeedbackItem(query=f"q{w}-{i}", document="d", label=i % 2, source=f"w{w}")])
    else:
        append_traffic(store, [(f"t{w}-{i}", "d")])
"""

_PROMOTER = _OPEN + """
import os, time
from ragsieve.evolve.live import promote_feedback
while not os.path.exists(sys.argv[4]):  # until the writers are done
    promote_feedback(store)
    time.sleep(0.05)
"""


def test_concurrent_writer_processes_lose_no_row(location):
    """Three feedback writers, a traffic writer and a process promoting feedback into rounds, all at once."""
    from ragsieve.evolve.live import promote_feedback
    from ragsieve.evolve.store import EvolveStore

    make_store(location, max_traffic=10_000)
    n = 30
    writers = [("feedback", w) for w in range(3)] + [("traffic", 0)]
    done = location.dir.parent / "writers-done"
    promoter = subprocess.Popen(_script(_PROMOTER) + _store_arg(location) + [str(done)], env=_env())
    procs = [subprocess.Popen(_script(_WRITER) + _store_arg(location) + [kind, str(w), str(n)], env=_env())
             for kind, w in writers]
    assert [p.wait(timeout=300) for p in procs] == [0] * len(procs)
    done.touch()
    assert promoter.wait(timeout=60) == 0
    promote_feedback(location)  # whatever came after the promoter stopped

    s = EvolveStore(location)
    live = [x for r in s.example_rounds() for x in s.examples(r) if x.id.startswith("live-")]
    assert sorted(x.query for x in live) == sorted(f"q{w}-{i}" for w in range(3) for i in range(n))
    assert len({x.id for x in live}) == len(live)  # each row promoted exactly once
    assert s.feedback([x.id for x in live]) == {x.id: x.label for x in live}
    from ragsieve.evolve.live import promote_traffic

    traffic_round = promote_traffic(location)
    assert sorted(x.query for x in s.examples(traffic_round)) == [f"t0-{i}" for i in sorted(range(n), key=str)]
    if not location.postgres:
        with sqlite3.connect(location.dir / "evolve.sqlite") as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


_KILLED = _OPEN + """
import time
from ragsieve import evolve_db as db
from ragsieve.evolve.store import EvolveStore
with EvolveStore(store).transaction() as conn:
    db.insert_rows(conn, db.live_feedback, [{"query": f"q{i}", "document": "d", "label": 1, "source": "kill",
                                              "added_at": "now"} for i in range(200)])
    print("INSERTED", flush=True)
    time.sleep(600)
"""


def test_a_writer_killed_mid_transaction_leaves_no_half_row(location):
    from ragsieve.evolve.live import FeedbackItem, append_feedback, pending_feedback, promote_feedback

    make_store(location)
    proc = subprocess.Popen(_script(_KILLED) + _store_arg(location), stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert proc.stdout.readline().strip() == "INSERTED"  # inside the transaction, holding the writer lock
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert pending_feedback(location) == 0  # none of its 200 rows
    start = time.monotonic()
    append_feedback(location, [FeedbackItem(query="after", document="d", label=1)])  # the lock died with it
    assert promote_feedback(location) == 1 and time.monotonic() - start < 30
    assert pending_feedback(location) == 0


def test_serve_appends_feedback_and_traffic_to_the_store(location):
    from ragsieve.evolve.live import pending_feedback, promote_traffic
    from ragsieve.serve import ServeConfig, create_app
    from ragsieve.serve.runner import BackgroundServer

    make_store(location)
    # a PostgreSQL store by URL alone: a replica needs no folder to collect feedback
    name = location.url if location.postgres else str(location.dir)
    app = create_app(ServeConfig(reranker="bm25", feedback_store=name, log_traffic=True))
    with BackgroundServer(app) as server:
        r = httpx.post(f"{server.url}/v1/feedback", json=[{"query": "q", "chosen": "a", "rejected": "b"}])
        assert r.status_code == 200 and r.json()["stored"] == 2 and r.json()["pending"] == 2, r.text
        body = {"query": "who wrote hamlet", "documents": ["Shakespeare wrote Hamlet.", "Paris"]}
        assert httpx.post(f"{server.url}/v1/rerank", json=body).status_code == 200
        app.state.serve.traffic.flush()
    assert pending_feedback(location) == 2
    assert promote_traffic(location) == 2


def test_feedback_to_a_database_that_went_away_is_503(postgres):
    from ragsieve.serve import ServeConfig, create_app
    from ragsieve.serve.runner import BackgroundServer

    url = postgres.new_database()
    make_store(url)  # the rows alone: no folder
    item = {"query": "q", "document": "d", "label": 1}
    with_password = url.replace("postgres@", "postgres:hunter2@")  # the test server trusts any password
    with BackgroundServer(create_app(ServeConfig(reranker="bm25", feedback_store=with_password))) as server:
        assert httpx.post(f"{server.url}/v1/feedback", json=item).status_code == 200
        postgres.drop_database(url)
        r = httpx.post(f"{server.url}/v1/feedback", json=item)
        assert r.status_code == 503 and r.json()["error"].startswith("feedback store unavailable"), r.text
        assert "hunter" not in r.text and len(r.json()["error"].splitlines()) == 1
        body = {"query": "who wrote hamlet", "documents": ["Shakespeare wrote Hamlet.", "Paris"]}
        assert httpx.post(f"{server.url}/v1/rerank", json=body).status_code == 200  # ranking goes on


# --------------------------------------------------------------------------- naming a store


def test_a_postgres_store_is_named_by_its_folder_or_url(postgres, tmp_path, cli):
    from ragsieve.evolve.store import store_status
    from ragsieve.evolve_db import DB_POINTER, locate_store

    url = postgres.new_database()
    folder = tmp_path / "store"
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"query": q, "passage": p, "label": y}) + "\n" for q, p, y in ROWS))
    result = cli("evolve", "init", "--store", folder, "--db", url, "--examples", rows)
    assert result.code == 0, result.err
    assert not (folder / "evolve.sqlite").exists() and (folder / DB_POINTER).read_text().strip() == url
    assert store_status(folder)["database"] == url  # the folder remembers its database
    status = cli("evolve", "status", "--store", folder)
    assert status.code == 0 and f"rows in {url}" in " ".join(status.out.split()), status.out
    assert store_status(url)["store"] == url  # the rows alone
    assert cli("evolve", "status", "--store", url, "--json").code == 0
    fb = tmp_path / "fb.jsonl"
    fb.write_text(json.dumps({"query": "q", "document": "d", "label": 1}) + "\n")
    added = cli("feedback", "add", fb, "--store", url)
    assert added.code == 0 and "1 waiting" in added.out, added.out + added.err

    other = postgres.new_database()
    for args, needle in [
        (("evolve", "status", "--store", folder, "--db", other), "keeps its rows in"),
        (("evolve", "status", "--store", tmp_path / "empty", "--db", other), "no evolve store in"),
        (("evolve", "init", "--store", tmp_path / "again", "--db", url, "--examples", rows), "already holds"),
        (("evolve", "status", "--store", folder, "--db", "mysql://x@y/z"), "PostgreSQL"),
        (("evolve", "status", "--store", url.replace(str(postgres.port), "1")), "cannot connect"),
        (("evolve", "init", "--store", url, "--examples", rows), "give the database with --db"),
        (("evolve", "step", "--store", url), "needs the store folder"),
    ]:
        result = cli(*args)
        assert result.code == 2 and len(result.err.strip().splitlines()) == 1 and needle in result.err, result.err
    assert not (tmp_path / "again").exists()  # a refused init leaves no folder
    with pytest.raises(RagsieveError, match="needs the store folder"):
        locate_store(url).need_dir("evolve step")
    # a password never lands in the folder
    secret = url.replace("postgres@", "postgres:hunter2@")
    assert locate_store(folder, secret).url == locate_store(secret).url
    assert "hunter2" not in locate_store(secret).label


def test_init_store_on_a_url_alone_returns_that_url(postgres):
    """The store ``init_store`` returns names the store it made: a URL stays the URL (as a Path its ``//``
    folded into ``/``, a relative folder named ``postgresql:``)."""
    from ragsieve.evolve.live import pending_feedback
    from ragsieve.evolve_db import close_engines

    url = postgres.new_database()
    store = make_store(url)
    assert store == url and pending_feedback(store) == 0  # the returned name opens the store
    close_engines()


# --------------------------------------------------------------------------- schema versions

# the SQLite layout of the store before versioned migrations (schema version 1), verbatim
_V1_DDL = """
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
CREATE TABLE IF NOT EXISTS live_feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT, query TEXT NOT NULL, document TEXT NOT NULL, label INTEGER NOT NULL,
    source TEXT NOT NULL, pair_id TEXT, fields TEXT, added_at TEXT NOT NULL, round INTEGER
);
CREATE INDEX IF NOT EXISTS live_feedback_round ON live_feedback(round);
"""


def _v1_store(folder):
    """A store file exactly as the code before schema versions wrote it: config, rows, a finished round."""
    from ragsieve.evolve.store import EvolveStoreConfig

    folder.mkdir()
    conn = sqlite3.connect(folder / "evolve.sqlite")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(_V1_DDL)
    with conn:
        config = EvolveStoreConfig(template="relevance").model_dump_json()
        conn.execute("INSERT INTO meta VALUES ('config', ?)", (config,))
        for i, (q, p, y) in enumerate(ROWS):
            x = _pair(9 - i, q, p, y)
            conn.execute("INSERT INTO examples VALUES (?, 0, ?)", (x.id, json.dumps(x.to_json())))
            conn.execute("INSERT INTO feedback VALUES (?, ?, 'then')", (x.id, y))
            conn.execute("INSERT INTO pairs VALUES (?, 0, ?, 'gold')", (x.id, y))
        x = _pair(5, "q", "held out", 1)
        conn.execute("INSERT INTO test_examples VALUES (?, ?)", (x.id, json.dumps(x.to_json())))
        conn.execute("INSERT INTO rounds VALUES (0, 'sft', 'adapters/round-000', '{\"n_new_pairs\": 4}', 'then')")
        conn.execute("INSERT INTO live_feedback (query, document, label, source, added_at)"
                     " VALUES ('lq', 'ld', 1, 'ui', 'then')")
    conn.close()
    return folder


def test_an_old_sqlite_store_opens_migrated_with_its_rows_and_order(tmp_path, cli):
    from ragsieve.evolve.live import promote_feedback, promote_traffic, append_traffic
    from ragsieve.evolve.store import EvolveStore, store_status
    from ragsieve.evolve_db import SCHEMA_VERSION

    folder = _v1_store(tmp_path / "old")
    s = EvolveStore(folder)
    with sqlite3.connect(folder / "evolve.sqlite") as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        assert [r[1] for r in conn.execute("PRAGMA table_info(examples)")][:2] == ["seq", "id"]
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert [x.id for x in s.examples(0)] == ["x9", "x8", "x7", "x6"]  # rowid order became seq order
    assert [x.id for x in s.test_examples()] == ["x5"]
    assert s.adapters() == [folder / "adapters" / "round-000"] and len(s.pairs()) == 4
    assert promote_feedback(folder) == 1  # the old live feedback row, and the traffic table the old file lacked
    assert append_traffic(folder, [("tq", "td")]) == 1 and promote_traffic(folder) == 2
    assert EvolveStore(folder).examples(1)[0].id == "live-1"
    status = cli("evolve", "status", "--store", folder, "--json")
    assert status.code == 0 and json.loads(status.out)["rounds"][0]["n_new_pairs"] == 4
    assert store_status(folder)["queued"][0] == {"round": 1, "examples": 1, "feedback": 1}

    newer = tmp_path / "newer"  # a store from a newer ragsieve is refused, not rewritten
    newer.mkdir()
    with sqlite3.connect(folder / "evolve.sqlite") as conn, sqlite3.connect(newer / "evolve.sqlite") as copy:
        conn.backup(copy)
        copy.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(RagsieveError, match="newer than this ragsieve"):
        EvolveStore(newer)


# --------------------------------------------------------------------------- evolve step on PostgreSQL


def test_evolve_step_trains_from_a_postgres_store_and_serves_its_rounds(postgres, tmp_path, tiny_llm_dir, cli):
    from ragsieve.evolve.store import EvolveStore
    from ragsieve.evolve_db import step_lock
    from ragsieve.registry import load_reranker

    url = postgres.new_database()
    folder = tmp_path / "store"
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"query": q, "passage": p, "label": y}) + "\n" for q, p, y in ROWS * 2))
    config = tmp_path / "store.yaml"
    config.write_text(json.dumps({"m0_train": {"lr": 2e-2, "epochs": 1, "batch_size": 4},
                                  "train": {"lr": 5e-2, "batch_size": 4, "epochs": 1}}))
    assert cli("evolve", "init", "--store", folder, "--db", url, "--llm", tiny_llm_dir, "--examples", rows,
               "--max-prompt-tokens", 200, "--config", config).code == 0
    first = cli("evolve", "step", "--store", folder)
    assert first.code == 0 and "round 0 (sft): 8 examples, 8 accepted labels" in first.out, first.out + first.err
    fb = tmp_path / "fb.jsonl"
    fb.write_text(json.dumps({"query": ROWS[0][0], "chosen": ROWS[0][1], "rejected": ROWS[1][1]}) + "\n")
    assert cli("feedback", "add", fb, "--store", url).code == 0  # what a replica's /v1/feedback writes
    second = cli("evolve", "step", "--store", folder)
    assert second.code == 0 and "live feedback queued as round 1" in second.out, second.out + second.err
    assert "round 1 (feedback): 2 examples, 2 accepted labels" in second.out
    s = EvolveStore(folder)
    assert [r["mode"] for r in s.round_log()] == ["sft", "feedback"] and len(s.adapters()) == 2
    with step_lock(s.location, s.engine):  # a step elsewhere (another machine's folder) holds the database
        busy = cli("evolve", "step", "--store", folder)
    assert busy.code == 2 and "another `evolve step` is running on postgresql://" in busy.err, busy.err
    served = load_reranker(f"evolve:{folder}")  # config and adapters read from the rows in PostgreSQL
    assert len(served.rank(ROWS[0][0], [ROWS[0][1], ROWS[1][1]]).results) == 2
