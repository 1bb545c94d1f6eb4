"""Running ``ragsieve serve`` in production (#63): scores that do not depend on their batch, fair scheduling
across requests, /metrics and /ready, start-up checks, graceful shutdown, errors in users' words."""

from __future__ import annotations

import random

import numpy as np
import pytest

WORDS = ("the river city king war music paris hamlet shakespeare wrote tragedy play moon landing 1972 apollo "
         "physics prize nobel einstein energy light speed planet orbit sun earth water ocean forest tree bird song "
         "history empire rome emperor battle army bridge tower church painting museum novel author poem").split()


def varied_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(query, document) pairs from a few queries, documents of 3 to 120 words (padded widths vary a lot)."""
    rng = random.Random(seed)
    queries = [" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) + "?" for _ in range(20)]
    return [(rng.choice(queries), " ".join(rng.choices(WORDS, k=rng.choice([rng.randint(3, 40),
                                                                             rng.randint(40, 120)]))))
            for _ in range(n)]


@pytest.mark.parametrize("bf16", ["1", "0"], ids=["bf16-cpu", "cpu-without-bf16"])
def test_the_default_reranker_scores_a_pair_the_same_in_any_batch(monkeypatch, bf16):
    """100 pairs scored alone and in 3 random batch compositions (as serve's worker mixes requests): the default
    reranker's backends with bf16 units (torch-bf16 + OpenVINO bf16) and without (torch fp32 + int8 ONNX)."""
    from ragsieve.models.cpu import fast_bf16
    from ragsieve.registry import load_reranker
    from ragsieve.rerank.chunks import window_reader

    monkeypatch.setenv("RAGSIEVE_CPU_BF16", bf16)
    fast_bf16.cache_clear()
    try:
        ranker = window_reader(load_reranker("embedded:base", whole_passages=False))
    finally:
        fast_bf16.cache_clear()
    pairs = varied_pairs(100)

    def score(group):
        return ranker.score_pairs([q for q, _ in group], [d for _, d in group])

    alone = np.array([score([pair])[0] for pair in pairs])
    rng = random.Random(1)
    for _ in range(3):
        order = list(range(len(pairs)))
        rng.shuffle(order)
        batched, lo = np.zeros(len(pairs)), 0
        while lo < len(order):
            idx = order[lo: lo + rng.randint(1, 64)]
            batched[idx] = score([pairs[i] for i in idx])
            lo += len(idx)
        assert np.abs(batched - alone).max() <= 1e-4


def scrape(url: str, headers=None) -> dict[tuple[str, tuple], float]:
    """``/metrics`` parsed by prometheus_client's own parser: {(sample name, sorted labels): value}."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", headers=headers or {}).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_small_request_is_answered_while_a_2mb_request_scores():
    """The default reranker on a real server: a 1-document request sent while 40 documents of 49k characters
    (≈ 2 MB, within every limit, 320 model windows) are scored joins the next model call: it is answered after
    at most a slice or two of the big request, not after all of it (how long that takes is bench/serve.py
    --fairness's to measure)."""
    import threading
    import time

    import httpx

    from ragsieve.serve import ServeConfig, create_app
    from ragsieve.serve.runner import BackgroundServer

    app = create_app(ServeConfig(reranker="embedded:base"))  # the default token budgets
    rng = random.Random(0)
    big = {"query": "who wrote hamlet", "documents": [" ".join(rng.choices(WORDS, k=8_000))[:49_000]
                                                       for _ in range(40)]}
    with BackgroundServer(app) as server:
        def send_big():
            try:
                httpx.post(f"{server.url}/v1/rerank", json=big, timeout=600)
            except httpx.HTTPError:
                pass  # the server shut down under it (end of the test)

        threading.Thread(target=send_big, daemon=True).start()
        key = ("ragsieve_queue_pairs", (("model", "ranker"),))
        while scrape(server.url).get(key, 0) < 100:  # the big request is queued and scoring
            time.sleep(0.2)
        r = httpx.post(f"{server.url}/v1/rerank", timeout=600,
                       json={"query": "who wrote hamlet", "documents": ["Shakespeare wrote Hamlet around 1600."]})
        assert r.status_code == 200, r.text
        left = scrape(server.url)[key]
        # 320 windows, 8 a slice (2048 tokens): the small one waited for the slice being scored, then had its call
        assert left >= 320 - 3 * 8, f"the small request waited for {320 - left:.0f} of the big one's windows"


def test_metrics_parse_and_move_with_traffic_and_ready_answers(tmp_path):
    import httpx

    from ragsieve.serve import ServeConfig, create_app
    from ragsieve.serve.runner import BackgroundServer
    from tests.test_serve_feedback import make_store

    store = make_store(tmp_path / "store")
    config = ServeConfig(reranker="bm25", feedback_store=str(store), log_traffic=True, api_key="k3y")
    auth = {"Authorization": "Bearer k3y"}
    with BackgroundServer(create_app(config)) as server:
        assert httpx.get(f"{server.url}/ready").json()["status"] == "ready"  # a probe needs no key
        assert httpx.get(f"{server.url}/metrics").status_code == 401
        before = scrape(server.url, auth)
        docs = ["Shakespeare wrote Hamlet.", "Paris is the capital of France.", "Hamlet is a tragedy."]
        for _ in range(3):
            r = httpx.post(f"{server.url}/v1/rerank", json={"query": "who wrote hamlet", "documents": docs},
                           headers=auth)
            assert r.status_code == 200, r.text
        assert httpx.post(f"{server.url}/v1/rerank", json={"query": "q"}, headers=auth).status_code == 422
        r = httpx.post(f"{server.url}/v1/feedback", json={"query": "q", "document": "d", "label": 1}, headers=auth)
        assert r.status_code == 200, r.text
        app_state = server.server.config.app.state.serve
        app_state.traffic.flush()
        after = scrape(server.url, auth)

    def moved(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert moved("ragsieve_requests_total", route="/v1/rerank", status="200") == 3
    assert moved("ragsieve_requests_total", route="/v1/rerank", status="422") == 1
    assert moved("ragsieve_request_seconds_count", route="/v1/rerank") == 4
    assert moved("ragsieve_pairs_scored_total", model="ranker") == 9
    assert moved("ragsieve_batch_pairs_count", model="ranker") >= 1
    assert moved("ragsieve_queue_wait_seconds_count", model="ranker") == 3
    assert moved("ragsieve_feedback_rows_total", outcome="written") == 1
    assert moved("ragsieve_traffic_rows_total", outcome="written") == 3  # the store keeps a repeated pair once
    assert after[("ragsieve_queue_requests", (("model", "ranker"),))] == 0
    assert after[("ragsieve_model_info", (("model", "bm25"), ("version", "1")))] == 1


def test_a_request_over_its_pair_budget_is_a_413_naming_the_limit():
    import httpx

    from ragsieve.serve import ServeConfig, create_app
    from ragsieve.serve.runner import BackgroundServer

    with BackgroundServer(create_app(ServeConfig(reranker="bm25", max_pairs_per_request=3))) as server:
        r = httpx.post(f"{server.url}/v1/rerank", json={"query": "q", "documents": ["a b c", "d e f", "g", "h"]})
        assert r.status_code == 413 and "max_pairs_per_request is 3" in r.json()["error"], r.text
        ok = httpx.post(f"{server.url}/v1/rerank", json={"query": "hamlet", "documents": ["hamlet play", "paris"]})
        assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("body, says", [
    ("x", "body: must be a JSON object or a JSON array"),
    ({"query": "q"}, "body: give either 'document' and 'label', or 'chosen' and 'rejected'"),
    ({"query": "q", "document": "d", "label": 2}, "label: must be less than or equal to 1"),
    ([{"query": "q"}], "0: give either 'document' and 'label', or 'chosen' and 'rejected'"),
    ({"query": 5, "document": "d", "label": 1}, "query: must be a string"),
])
def test_feedback_errors_name_the_field_and_rule_in_users_words(tmp_path, body, says):
    import httpx

    from ragsieve.serve import ServeConfig, create_app
    from ragsieve.serve.runner import BackgroundServer
    from tests.test_serve_feedback import make_store

    store = make_store(tmp_path / "store")
    with BackgroundServer(create_app(ServeConfig(reranker="bm25", feedback_store=str(store)))) as server:
        r = httpx.post(f"{server.url}/v1/feedback", json=body)
    assert r.status_code == 422 and r.json()["error"] == says, r.text


def test_sigterm_under_load_loses_no_acknowledged_feedback_row(tmp_path):
    """`ragsieve serve` in its own process, clients writing feedback and traffic: SIGTERM stops it with exit 0,
    and every row a client got a 200 for is in the store."""
    import signal
    import threading

    import httpx

    from tests.test_serve_feedback import live_rows

    store = make_store_here(tmp_path)
    proc, url = start_cli_server(["-r", "bm25", "--feedback-store", str(store), "--log-traffic"],
                                 {"drain_s": 0.5}, tmp_path)
    acknowledged, served, stop = [], [], threading.Event()
    try:
        def client(n: int):
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    r = httpx.post(f"{url}/v1/feedback", timeout=30,
                                   json={"query": f"q{n}-{i}", "document": "d", "label": i % 2})
                    if r.status_code == 200:
                        acknowledged.append(r.json()["stored"])
                    r = httpx.post(f"{url}/v1/rerank", timeout=30,
                                   json={"query": f"hamlet {n}-{i}", "documents": ["hamlet play", "paris city"]})
                    if r.status_code == 200:
                        served.append(2)
                except httpx.HTTPError:
                    return  # the server stopped accepting

        threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        while len(acknowledged) < 40:
            threading.Event().wait(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
    for t in threads:
        t.join(timeout=60)
    assert len(live_rows(store)) == sum(acknowledged) > 0
    from sqlalchemy import func, select

    from ragsieve import evolve_db as db
    from ragsieve.evolve.store import EvolveStore

    traffic = EvolveStore(store)._rows(select(func.count()).select_from(db.live_traffic))[0][0]
    assert traffic >= sum(served)


def start_cli_server(args: list[str], config: dict | None = None, tmp_path=None):
    """``ragsieve serve`` in its own process on a free loopback port: (process, URL)."""
    import json
    import os
    import subprocess
    import sys

    if config:
        path = tmp_path / "serve.json"
        path.write_text(json.dumps(config))
        args = [*args, "-c", str(path)]
    code = "import sys; from ragsieve.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--port", "0", "--log-level", "warning", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    return proc, proc.stdout.readline().split()[2]


# SIGTERM while the requests are still arriving, and once all are queued and being scored
@pytest.mark.parametrize("delay", [0.1, 2.0])
def test_sigterm_resets_no_request_that_reached_the_server(tmp_path, delay):
    """A rolling restart: 20 concurrent requests, SIGTERM `delay` s after they were sent. Every client gets a
    200 (or a 503 with Retry-After), none a reset; /ready answers 503 from the signal on; exit status 0."""
    import asyncio
    import signal

    import httpx

    rng = random.Random(0)
    docs = [" ".join(rng.choices(WORDS, k=12)) for _ in range(30)]
    proc, url = start_cli_server(["-r", "embedded:base"], {"drain_s": 1.0, "shutdown_grace_s": 60}, tmp_path)

    async def run() -> tuple[list, int]:
        async with httpx.AsyncClient(base_url=url, timeout=120,
                                     limits=httpx.Limits(max_connections=40)) as client:
            sent = [asyncio.create_task(client.post("/v1/rerank", json={"query": f"hamlet {i}", "documents": docs}))
                    for i in range(20)]
            await asyncio.sleep(delay)
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.05)
            ready = (await client.get("/ready")).status_code
            return await asyncio.gather(*sent, return_exceptions=True), ready

    try:
        answers, ready = asyncio.run(run())
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    resets = [repr(a) for a in answers if isinstance(a, Exception)]
    assert not resets, resets
    assert all(a.status_code == 200 or (a.status_code == 503 and a.headers.get("retry-after")) for a in answers), \
        [a.status_code for a in answers]
    assert ready == 503


def make_store_here(tmp_path):
    from tests.test_serve_feedback import make_store

    return make_store(tmp_path / "store")


def test_a_second_request_over_the_same_documents_encodes_nothing(tmp_path):
    """--embedding-cache-mb: the default's cosine half keeps passage vectors across requests; meta and
    /metrics say so."""
    import httpx

    from ragsieve.serve import ServeConfig, create_app
    from ragsieve.serve.runner import BackgroundServer

    docs = ["Shakespeare wrote Hamlet around 1600.", "Paris is the capital of France.", "Hamlet is a tragedy."]
    with BackgroundServer(create_app(ServeConfig(reranker="embedded:base", embedding_cache_mb=8))) as server:
        metas = []
        for query in ("who wrote hamlet", "what is the capital of france"):
            r = httpx.post(f"{server.url}/v1/rerank", json={"query": query, "documents": docs}, timeout=60)
            assert r.status_code == 200, r.text
            metas.append(r.json()["meta"]["embedding_cache"])
        metrics = scrape(server.url, {})
    first, second = metas
    assert first["misses"] == 3 and first["entries"] == 3
    assert second["misses"] == 3 and second["hits"] == first["hits"] + 3  # nothing encoded the second time
    assert metrics[("ragsieve_embedding_cache_lookups_total", (("outcome", "hit"),))] == second["hits"]
    assert 0 < metrics[("ragsieve_embedding_cache_bytes", ())] <= 8 * 1024 * 1024
