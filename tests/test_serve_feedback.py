"""Live feedback → evolve store: /v1/feedback, `ragsieve feedback add`, concurrent writers, promotion to a round."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import httpx
import pytest

from ragsieve.serve import ServeConfig, create_app
from ragsieve.serve.runner import BackgroundServer


def make_store(path, llm: str = "embedded:smollm2-135m-instruct", **config):
    """An evolve store on the fever template with a two-example SFT set (nothing trained)."""
    from ragsieve.data.records import LabeledPair
    from ragsieve.evolve.store import EvolveStoreConfig, init_store
    from ragsieve.prompts.verdicts import get_template

    t = get_template("fever")
    initial = [
        LabeledPair(f"s{i}", f"s{i}", q, p, y, t.fields_for(q, p), dataset="fever")
        for i, (q, p, y) in enumerate(
            [
                ("Paris is in France.", "Paris is the capital of France.", 1),
                ("Hamlet is a novel.", "Hamlet is a tragedy.", 0),
            ]
        )
    ]
    return init_store(path, EvolveStoreConfig(template="fever", llm=llm, **config), initial)


def live_rows(store) -> list[tuple]:
    """Every live feedback row, promoted or not, in arrival order: a store folder or a ``postgresql://`` URL."""
    from sqlalchemy import select

    from ragsieve import evolve_db as db
    from ragsieve.evolve.store import EvolveStore

    t = db.live_feedback
    rows = EvolveStore(store)._rows(select(t.c.query, t.c.document, t.c.label, t.c.source, t.c.pair_id, t.c.round)
                                    .order_by(t.c.id))
    return [tuple(row) for row in rows]


def test_feedback_endpoint_appends_and_evolve_step_gets_a_full_feedback_round(tmp_path, cli):
    store = make_store(tmp_path / "store")
    with BackgroundServer(create_app(ServeConfig(reranker="bm25", feedback_store=str(store)))) as server:
        r = httpx.post(f"{server.url}/v1/feedback", json={"query": "q1", "document": "d1", "label": 1, "source": "ui"})
        assert r.status_code == 200 and r.json()["stored"] == 1, r.text
        r = httpx.post(f"{server.url}/v1/feedback", json=[{"query": "q2", "chosen": "good", "rejected": "bad"}])
        assert r.json() == {"stored": 2, "pending": 3, "request_id": r.headers["x-request-id"]}
        for bad in (
            {"query": "q"},
            {"query": "q", "document": "d", "label": 2},
            {"query": "q", "document": "d", "label": 1, "chosen": "c", "rejected": "r"},
            {"query": "", "document": "d", "label": 0},
        ):
            assert httpx.post(f"{server.url}/v1/feedback", json=bad).status_code == 422, bad
    rows = live_rows(store)
    assert rows[0] == ("q1", "d1", 1, "ui", None, None)
    assert [(r[1], r[2], r[3]) for r in rows[1:]] == [("good", 1, "api"), ("bad", 0, "api")] and rows[1][4] == rows[2][
        4
    ]

    from ragsieve.evolve.live import promote_feedback
    from ragsieve.evolve.store import EvolveStore, store_status

    assert promote_feedback(store) == 1
    assert promote_feedback(store) is None  # nothing new since
    assert store_status(store)["queued"][-1] == {"round": 1, "examples": 3, "feedback": 3}  # a full-feedback round
    s = EvolveStore(store)
    try:
        ex = s.examples(1)
        assert [(x.fields["claim"], x.fields["evidence"], x.label) for x in ex] == [
            ("q1", "d1", 1),
            ("q2", "good", 1),
            ("q2", "bad", 0),
        ]
    finally:
        s.close()
    assert {r[5] for r in live_rows(store)} == {1}


def test_feedback_without_a_store_is_400(tmp_path):
    with BackgroundServer(create_app(ServeConfig(reranker="bm25"))) as server:
        r = httpx.post(f"{server.url}/v1/feedback", json={"query": "q", "document": "d", "label": 1})
        assert r.status_code == 400 and "no feedback store" in r.json()["error"]
    with pytest.raises(Exception, match="no evolve store"):
        create_app(ServeConfig(reranker="bm25", feedback_store=str(tmp_path / "missing")))


def test_feedback_add_cli(tmp_path, cli):
    store = make_store(tmp_path / "store")
    good = tmp_path / "fb.jsonl"
    good.write_text(
        json.dumps({"query": "q", "document": "d", "label": 0, "source": "batch"})
        + "\n"
        + json.dumps({"query": "q", "chosen": "a", "rejected": "b"})
        + "\n"
    )
    result = cli("feedback", "add", good, "--store", store)
    assert result.code == 0 and "stored 3 feedback row(s); 3 waiting" in result.out
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"query": "q", "document": "d", "label": 1}) + "\n" + json.dumps({"query": "q", "label": 1}) + "\n"
    )
    result = cli("feedback", "add", bad, "--store", store)
    assert result.code == 2 and f"{bad}:2" in result.err
    assert len(live_rows(store)) == 3  # the bad file wrote nothing


def test_eight_concurrent_writer_processes_lose_no_row(tmp_path):
    store = make_store(tmp_path / "store")
    per_process = 25
    code = (
        "import sys; from ragsieve.evolve.live import FeedbackItem, append_feedback\n"
        "w = sys.argv[1]\n"
        f"for i in range({per_process}):\n"
        "    item = FeedbackItem(query=f'q{w}-{i}', document='d', label=i % 2, source=f'w{w}')\n"
        "    append_feedback(sys.argv[2], [item])\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(w), str(store)]) for w in range(8)]
    assert [p.wait(timeout=300) for p in procs] == [0] * 8
    queries = [r[0] for r in live_rows(store)]
    assert len(queries) == 8 * per_process
    assert set(queries) == {f"q{w}-{i}" for w in range(8) for i in range(per_process)}
    with sqlite3.connect(store / "evolve.sqlite") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_feedback_loop_serve_feedback_step_reload(tmp_path, tiny_llm_dir, cli):
    """The deployment loop: serve the store's model, collect feedback, `evolve step`, reload, serve the new round."""
    store = make_store(tmp_path / "store", llm=str(tiny_llm_dir), max_prompt_tokens=480)
    config = ServeConfig(reranker=f"evolve:{store}", feedback_store=str(store))
    docs = ["Paris is the capital of France.", "Hamlet is a tragedy.", "The fox jumps."]
    body = {"query": "Paris is in France.", "documents": docs}
    with BackgroundServer(create_app(config)) as server:
        before = httpx.post(f"{server.url}/v1/rerank", json=body, timeout=120).json()["results"]
        feedback = [
            {"query": "Paris is in France.", "document": docs[0], "label": 1, "source": "ui"},
            {"query": "Paris is in France.", "chosen": docs[0], "rejected": docs[2], "source": "ui"},
        ]
        assert httpx.post(f"{server.url}/v1/feedback", json=feedback).json()["stored"] == 3
        first = cli("evolve", "step", "--store", store)
        assert first.code == 0 and "live feedback queued as round 1" in first.out and "round 0 (sft)" in first.out
        second = cli("evolve", "step", "--store", store)
        assert second.code == 0 and "round 1 (feedback)" in second.out, second.out + second.err
        assert httpx.post(f"{server.url}/admin/reload", timeout=120).status_code == 200
        after = httpx.post(f"{server.url}/v1/rerank", json=body, timeout=120).json()["results"]
    from ragsieve.evolve.store import EvolveStore

    s = EvolveStore(store)
    try:
        assert len(s.adapters()) == 2  # rounds 0 and 1 trained: the reloaded server merges both
        assert {p.source for p in s.pairs() if p.round == 1} == {"gold"}
    finally:
        s.close()
    assert {r["index"]: r["relevance_score"] for r in after} != {r["index"]: r["relevance_score"] for r in before}


def test_a_damaged_store_is_one_line_on_every_feedback_path(tmp_path, cli):
    from ragsieve.errors import RagsieveError
    from ragsieve.evolve.live import FeedbackItem, append_feedback, promote_feedback

    store = make_store(tmp_path / "store")
    (store / "evolve.sqlite").write_bytes(b"this is not an SQLite file, just text\n" * 50)
    for wal in store.glob("evolve.sqlite-*"):
        wal.unlink()
    item = FeedbackItem(query="q", document="d", label=1)
    for call in (lambda: append_feedback(store, [item]), lambda: promote_feedback(store)):
        with pytest.raises(RagsieveError):
            call()
    result = cli("evolve", "step", "--store", store)
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1 and "evolve.sqlite" in result.err
    fb = tmp_path / "fb.jsonl"
    fb.write_text(json.dumps({"query": "q", "document": "d", "label": 1}) + "\n")
    result = cli("feedback", "add", fb, "--store", store)
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1


def test_feedback_to_a_store_damaged_while_serving_is_503(tmp_path):
    store = make_store(tmp_path / "store")
    with BackgroundServer(create_app(ServeConfig(reranker="bm25", feedback_store=str(store)))) as server:
        (store / "evolve.sqlite").write_bytes(b"this is not an SQLite file, just text\n" * 50)
        for wal in store.glob("evolve.sqlite-*"):
            wal.unlink()
        r = httpx.post(f"{server.url}/v1/feedback", json={"query": "q", "document": "d", "label": 1})
        assert r.status_code == 503 and r.json()["error"].startswith("feedback store unavailable"), r.text
