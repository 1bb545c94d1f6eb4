"""`ragsieve serve` on Ray Serve: two replicas on a real local Ray (2 CPUs) behind Serve's HTTP proxy.

The serve suite's client tests (the real cohere client, raw TEI / Open WebUI / Dify bodies,
/admin/reload) run again here against the 2-replica deployment; then a reload must reach both
replicas, feedback posted by several clients at once must land, from both replicas, in the one
PostgreSQL store they share and be what ``evolve step`` reads, and a replica killed mid-load must
cost no answer from the other, no feedback row, and come back.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
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
def bm25_server(request, tmp_path_factory):
    """Two replicas of BM25 sharing one feedback store, the name the imported tests expect: a database of
    the session's PostgreSQL (tools/postgres.py, which `make install` provides), as replicas on several
    machines would share it; a SQLite store folder only where PostgreSQL's binaries are absent."""
    from ray import serve

    from ragsieve.evolve_db import close_engines
    from ragsieve.serve import ServeConfig
    from ragsieve.serve.ray import serve_on_ray

    try:
        postgres = request.getfixturevalue("postgres")
    except pytest.skip.Exception:
        postgres = None
    store = postgres.new_database() if postgres else tmp_path_factory.mktemp("ray") / "store"
    make_store(store)
    config = ServeConfig(reranker="bm25", model_name="ragsieve-bm25", feedback_store=str(store), max_wait_ms=50)
    try:
        url = serve_on_ray(config, replicas=REPLICAS, port=0, num_cpus=2, reload_poll_s=0.2,
                           health_check_period_s=1.0)
        yield SimpleNamespace(url=url, store=store, postgres=postgres is not None)
    finally:
        serve.shutdown()
        ray.shutdown()
        close_engines()  # the test's own connections to the store


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


def test_reloads_leave_no_batch_loop_behind(bm25_server):
    """Each reload makes new batchers; they share the replica's one @serve.batch queue per model, so
    no idle batch loop (holding an old model) is left per reload."""
    from ray import serve

    from ragsieve.serve.ray import APP_NAME

    url = bm25_server.url
    for _ in range(2):  # with the reload test's, three reloads
        r = httpx.post(f"{url}/admin/reload", timeout=120)
        assert r.status_code == 200 and r.json()["replicas"] == REPLICAS, r.text
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until both replicas scored with their new batchers
        httpx.post(f"{url}/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=30)
        seen = replicas_seen(url, timeout=5)
        if len(seen) == REPLICAS and all(h["batches"] > 0 for h in seen.values()):
            break
    handle = serve.get_app_handle(APP_NAME)
    loops: dict[str, int] = {}
    for _ in range(40):  # the handle picks a replica per call
        replica, n = handle.batch_loops.remote().result(timeout_s=60)
        loops[replica] = n
        if len(loops) == REPLICAS:
            break
    assert loops == {replica: 1 for replica in seen}, loops  # the ranker's one loop each, however many reloads


def _feedback_rows(item: dict) -> list[tuple]:
    """The (query, document, label, source) rows one /v1/feedback item stores (a preference: two)."""
    if "document" in item:
        return [(item["query"], item["document"], item["label"], item["source"])]
    return [(item["query"], item["chosen"], 1, item["source"]), (item["query"], item["rejected"], 0, item["source"])]


def test_replicas_share_the_postgres_feedback_store(bm25_server):
    """Client threads post feedback at once; both replicas take some, every row lands once in the one
    PostgreSQL store, and `evolve step`'s reader (promote_feedback) queues all of them as its next round."""
    from ragsieve.evolve.live import pending_feedback, promote_feedback
    from ragsieve.evolve.store import EvolveStore

    if not bm25_server.postgres:
        pytest.skip("no PostgreSQL here: the replicas share a SQLite store")
    url, store = bm25_server.url, bm25_server.store
    rows_before, pending_before = len(live_rows(store)), pending_feedback(store)
    clients, per_client = 6, 15

    def post(k: int) -> list[tuple[dict, str]]:
        answered = []
        with httpx.Client(base_url=url, timeout=120) as http:
            for i in range(per_client):
                if i % 3 == 2:  # every third a preference: two rows sharing a pair_id
                    item = {"query": f"pg q{k}", "chosen": f"pg {k}-{i} good", "rejected": f"pg {k}-{i} bad"}
                else:
                    item = {"query": f"pg q{k}", "document": f"pg {k}-{i}", "label": i % 2}
                item["source"] = f"client{k}"
                r = http.post("/v1/feedback", json=item)
                assert r.status_code == 200 and r.json()["stored"] == len(_feedback_rows(item)), r.text
                answered.append((item, r.headers["x-ragsieve-replica"]))
        return answered

    with ThreadPoolExecutor(clients) as pool:
        answered = [a for batch in pool.map(post, range(clients)) for a in batch]
    assert len({replica for _, replica in answered}) == REPLICAS, answered  # both replicas wrote
    want = sorted(row for item, _ in answered for row in _feedback_rows(item))
    stored = live_rows(store)[rows_before:]
    assert sorted(row[:4] for row in stored) == want  # every row, once: none lost, none doubled
    pair_ids = [row[4] for row in stored if row[4] is not None]
    assert len(pair_ids) == 2 * len(set(pair_ids)) == 2 * clients * (per_client // 3)  # preferences stay pairs
    assert pending_feedback(store) == pending_before + len(want)

    round_id = promote_feedback(store)  # what `evolve step` runs first: the feedback becomes a round
    s = EvolveStore(store)
    examples = s.examples(round_id)
    assert len(examples) == pending_before + len(want) and pending_feedback(store) == 0
    assert sorted((x.query, x.passage, x.label, x.group) for x in examples if x.query.startswith("pg q")) == want
    assert s.feedback([x.id for x in examples]) == {x.id: x.label for x in examples}  # gold labels, recorded


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
