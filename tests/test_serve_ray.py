"""`ragsieve serve` on Ray Serve: two replicas on a real local Ray (2 CPUs) behind Serve's HTTP proxy.

The serve suite's client tests (the real cohere client, raw TEI / Open WebUI / Dify bodies,
/admin/reload) run again here against the 2-replica deployment; then a reload must reach both
replicas, and a replica killed mid-load must cost no answer from the other, no feedback row,
and come back.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import httpx
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is part of the dev install")
pytest.importorskip("ray.serve", reason="the ray extra is part of the dev install")

from tests.test_serve import (  # noqa: E402 - the serve suite's client tests, run against the replicas
    DOCS,
    QUERY,
    test_cohere_v2_client_gets_the_expected_order,  # noqa: F401
    test_health_models_reload_and_openapi,  # noqa: F401
    test_open_webui_and_dify_style_raw_json,  # noqa: F401
    test_tei_body_on_rerank_answers_in_tei_shape,  # noqa: F401
    test_uncalibrated_scores_are_the_logistic_of_the_raw_score,  # noqa: F401
)
from tests.test_serve_feedback import live_rows, make_store  # noqa: E402
from tests.test_serve_filter import (  # noqa: E402 - /v1/filter's client tests, on the [0, 1] scale
    test_a_threshold_outside_unit_range_is_a_one_line_422,  # noqa: F401
    test_without_a_grader_a_threshold_is_needed,  # noqa: F401
)

REPLICAS = 2


@pytest.fixture(scope="module")
def bm25_server(tmp_path_factory):
    """Two replicas of BM25 sharing one SQLite feedback store; the name the imported tests expect."""
    from ray import serve

    from ragsieve.serve import ServeConfig
    from ragsieve.serve.ray import serve_on_ray

    store = make_store(tmp_path_factory.mktemp("ray") / "store")
    config = ServeConfig(reranker="bm25", model_name="ragsieve-bm25", feedback_store=str(store), max_wait_ms=50)
    try:
        url = serve_on_ray(config, replicas=REPLICAS, port=0, num_cpus=2, reload_poll_s=0.2,
                           health_check_period_s=1.0)
        yield SimpleNamespace(url=url, store=store)
    finally:
        serve.shutdown()
        ray.shutdown()


def replicas_seen(url: str, want: int = REPLICAS, timeout: float = 30.0) -> dict[str, dict]:
    """/health by replica id, asked until ``want`` replicas answered (Serve spreads requests) or ``timeout``."""
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < want and time.monotonic() < deadline:
        try:
            health = httpx.get(f"{url}/health", timeout=10).json()
            seen[health["replica"]] = health
        except (httpx.HTTPError, KeyError, ValueError):  # a replica being replaced
            time.sleep(0.1)
    return seen


def test_two_replicas_answer_and_batch_with_serve_batch(bm25_server):
    url = bm25_server.url

    async def fire():
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await asyncio.gather(
                *[client.post("/v1/rerank", json={"query": f"{QUERY} {i}", "documents": DOCS}) for i in range(40)]
            )

    assert all(r.status_code == 200 for r in asyncio.run(fire()))
    seen = replicas_seen(url)
    assert len(seen) == REPLICAS, seen
    # every pair was scored by one replica's @serve.batch, and some batches held several requests
    assert sum(h["pairs"] for h in seen.values()) >= 40 * len(DOCS)
    assert sum(h["batches"] for h in seen.values()) < 40


def test_reload_reaches_every_replica(bm25_server):
    url = bm25_server.url
    for i in range(20):  # both replicas score something: their batch counters are > 0
        httpx.post(f"{url}/v1/rerank", json={"query": f"{QUERY} {i}", "documents": DOCS}, timeout=30)
    before = replicas_seen(url)
    assert len(before) == REPLICAS and all(h["batches"] > 0 for h in before.values()), before
    r = httpx.post(f"{url}/admin/reload", timeout=120)
    assert r.status_code == 200 and r.json()["status"] == "reloaded" and r.json()["replicas"] == REPLICAS, r.text
    # fresh models, fresh batchers: every replica, not only the one the request reached, starts at 0
    after = replicas_seen(url)
    assert set(after) == set(before) and all(h["batches"] == 0 for h in after.values()), after


def test_a_killed_replica_costs_no_feedback_and_comes_back(bm25_server):
    """Clients post rerank requests and feedback while one replica is killed: the other keeps answering,
    every feedback item is in the store (a client retries what was not acknowledged), Serve replaces
    the dead replica."""
    from ragsieve.serve.ray import APP_NAME

    url, store = bm25_server.url, bm25_server.store
    before = set(replicas_seen(url))
    assert len(before) == REPLICAS, before
    victim = sorted(before)[0]
    rows_before = len(live_rows(store))
    posted: list[str] = []
    failed_attempts = 0
    answered_after_kill = 0
    killed_at: list[float] = []

    async def client(k: int, http: httpx.AsyncClient, stop_at: float) -> None:
        nonlocal failed_attempts, answered_after_kill
        i = 0
        while time.monotonic() < stop_at:
            doc = f"kill-test client {k} item {i}"
            i += 1
            for _ in range(60):  # until acknowledged, as a real client does
                try:
                    r = await http.post("/v1/feedback", json={"query": QUERY, "document": doc, "label": i % 2})
                    if r.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                failed_attempts += 1
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"feedback {doc!r} never acknowledged")
            posted.append(doc)
            r = await http.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
            if r.status_code == 200 and killed_at and time.monotonic() > killed_at[0]:
                answered_after_kill += 1

    async def load_with_a_kill() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            stop_at = time.monotonic() + 6.0
            clients = [asyncio.ensure_future(client(k, http, stop_at)) for k in range(8)]
            await asyncio.sleep(1.5)
            replica = ray.get_actor(f"SERVE_REPLICA::{APP_NAME}#{APP_NAME}#{victim}", namespace="serve")
            ray.kill(replica, no_restart=True)  # Serve's controller, not Ray, must bring it back
            killed_at.append(time.monotonic())
            await asyncio.gather(*clients)

    asyncio.run(load_with_a_kill())
    stored = [row[1] for row in live_rows(store)[rows_before:]]
    print(f"kill: {len(posted)} feedback items acknowledged after {failed_attempts} failed attempts, "
          f"{len(stored)} rows stored, {answered_after_kill} rerank answers after the kill")
    assert answered_after_kill > 0  # the other replica kept answering
    assert set(posted) <= set(stored), sorted(set(posted) - set(stored))[:5]  # no acknowledged row is lost
    # a retried item whose first write landed is stored twice: never more often than attempts failed
    assert len(stored) - len(posted) <= failed_attempts
    # Serve replaces the dead replica: two answer again, one of them new
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = set(replicas_seen(url, timeout=5))
        if len(now) == REPLICAS:
            break
    assert victim not in now and len(now - before) == 1, (before, now)


def test_replicas_without_ray_is_a_one_line_error(cli):
    result = cli("serve", "-r", "bm25", "--replicas", "3")
    assert result.code == 2 and "--replicas needs --ray" in result.err
