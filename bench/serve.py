"""Service throughput under load: `ragsieve serve` vs the same reranker offline vs a plain server.

≥ 50 concurrent loopback clients send rerank requests of 20 documents of ~100 words
(NQ-oracle passages, else synthetic text; ``--documents multirc``: MultiRC passages of ≥ 240 words, longer
than the default's 256-token window, so both the service and the offline ranker read each by its best
chunk; writes ``serve_long.json``; ``--documents trace``: a replayed RAG trace, NQ questions each with the
passages BM25 retrieves for it from the demo's pool, so documents recur as in real traffic and the reranker's
passage-vector cache is exercised — its hit ratio is read from ``/metrics``; writes ``serve_trace.json``) for a
bounded time. The server runs in its own
process and serves exactly what ``ragsieve serve`` serves by default (``ServeConfig().reranker``,
today ``embedded:base`` with its cosine mix and calibration), unless ``--model`` names another
spec. Reported: pairs/s, request latency p50/p95/p99, errors (must be 0), and the
service/offline ratio: the service's pairs/s over the *same reranker* scoring the same pairs
in-process (``load_reranker(spec).score_pairs``; target ≥ 0.9). ``CrossEncoder.predict`` on the
cross-encoder folder is reported beside it, and the same folder is served by infinity-emb when
it is installed (target ratio ≥ 1.0), else by a plain FastAPI + ``CrossEncoder.predict`` server
(no batching across requests). Writes ``bench/results/serve.json``.

    python bench/serve.py [--model default|SPEC|DIR|minilm] [--clients 50] [--seconds 60]
    python bench/serve.py --clients 4 --seconds 3 --requests 8 --offline-pairs 32 --skip-baseline \
        --out /tmp/serve-smoke.json                     # smoke run

``--ray`` serves the same model on Ray Serve instead (``ragsieve serve --ray local``) with 1 and
then 2 replicas (``--replicas``), drives each the same way, then measures where feedback writes
saturate: ``POST /v1/feedback`` from the same clients on the last deployment (every acknowledged
row counted in the store, by the store's own reader) and the store's own write loop
(``append_feedback`` from 1 and 2 processes). The replicas share one feedback store, given as
``ragsieve serve --feedback-store`` takes it: by default a SQLite store in a temp folder;
``--postgres`` a throwaway PostgreSQL (``tools/postgres.py``: the tests' server, fsync on, loopback)
started for the run and stopped after it; ``--feedback-store DIR|postgresql://...`` one of your own (a
folder or an empty database: the bench creates the store there and refuses one that exists, since its
rows would join that store's next round). Writes ``bench/results/serve_ray.json``
(``serve_ray_postgres.json`` on PostgreSQL; the same per-run keys as ``served`` above, and
``feedback.store`` saying which store); no offline or baseline runs (see ``serve.json``).

    python bench/serve.py --ray --seconds 45 --grace 45                # SQLite store; ~4 min on 2 cores
    python bench/serve.py --ray --postgres --seconds 45 --grace 45     # replicas sharing PostgreSQL
    python bench/serve.py --ray --postgres --model bm25 --clients 4 --seconds 3 --requests 8 --grace 30 \
        --feedback-seconds 3 --out /tmp/serve-ray-pg-smoke.json         # smoke run (cheap BM25 scorer)

``--fairness`` measures what one big client costs the others, and what that costs throughput, on one server at
the default settings: small requests (1 document) sent one after another, first alone (``--small-seconds``),
then for ``--seconds`` while one client keeps sending 2 MB requests (40 documents of 49,000 characters), with
p50/p99 and their bootstrap intervals; then the replayed RAG trace (``--documents trace``'s requests) at
``--clients``, as a ratio to the same reranker offline on the trace's pairs (measured first, in this run).
Targets: the small requests' p99 beside the big ones < 1 s, the trace ≥ 0.9x offline. Writes
``bench/results/serve_fairness.json``.

    python bench/serve.py --fairness --seconds 60 --offline-pairs 1000       # ~5 min on 2 cores

``--filter`` serves a sieve that prunes (``--sieve``, default ``embedded:default``: rerank, top_k, its keep
head) and drives ``/v1/filter`` with the trace's requests at ``--clients``, against ``Sieve.filter`` offline on the
same requests one after another (documents/s; target ratio ≥ 0.9). Writes ``bench/results/serve_filter.json``.

    python bench/serve.py --filter --seconds 60 --offline-requests 60        # ~4 min on 2 cores

``--model minilm`` builds a cross-encoder with embedded:base's architecture (MiniLM-L6 +
a fresh 1-logit head) from the embedded all-MiniLM folder: the same cost, no training.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from ragsieve.machine import machine_info

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools.postgres: the throwaway PostgreSQL the tests use too


def resolve_model(spec: str, workdir: Path) -> tuple[str, str | None]:
    """(the reranker spec served and scored offline, its cross-encoder folder for the predict baselines)."""
    from ragsieve.registry import parse_reranker_spec

    if spec == "default":
        from ragsieve.serve.config import ServeConfig

        spec = ServeConfig().reranker  # what `ragsieve serve` serves with no option
    if spec == "minilm":
        from tools.baselines import minilm_cross_encoder

        target = minilm_cross_encoder(workdir / "minilm-ce")
        return f"cross-encoder:{target}", str(target)
    if Path(spec).is_dir():
        return f"cross-encoder:{spec}", spec
    scheme, arg = parse_reranker_spec(spec)
    if scheme == "embedded":  # a shipped cross-encoder (its fp16 safetensors folder), never trained here
        from ragsieve.rerank.shipped import embedded_reranker_dir

        return spec, str(embedded_reranker_dir(arg or "base"))
    return spec, arg if scheme in ("cross-encoder", "hf") else None


# passage length in words per document source: NQ's ~100-word passages fit the default's 256-token window;
# MultiRC's longest (~300+ words) do not, so serve and the offline ranker read them by their best chunk
DOCUMENT_SOURCES = {"nq-oracle": (60, 160), "multirc": (240, 10_000), "trace": (0, 10_000)}


def trace_requests(n: int, docs: int, seed: int = 0) -> tuple[list[dict], str]:
    """A replayed RAG trace: ``n`` NQ questions, each with the top ``docs`` passages BM25 retrieves for it from
    the demo's passage pool (NQ-oracle), so documents recur across requests as they do in real traffic."""
    from ragsieve.data import load_dataset
    from ragsieve.retrieve.bm25 import BM25Retriever

    ds = load_dataset("nq-oracle")
    questions = random.Random(seed).sample([q.text for q in ds.questions], min(n, len(ds.questions)))
    hits = BM25Retriever.build(ds.passages).search_batch(questions, k=docs)
    bodies = [{"model": "bench", "query": q, "documents": [h.passage.full_text for h in row]}
              for q, row in zip(questions, hits)]
    return bodies, "nq-oracle trace (BM25 top-k of the demo's pool)"


def metric_samples(url: str) -> list:
    """Every sample the server's ``/metrics`` answers (prometheus-client's parser)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    return [s for f in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text) for s in f.samples]


def cache_counts(url: str) -> dict | None:
    """The served reranker's passage-vector cache, from ``/metrics`` (None: it encodes no passages)."""
    samples = {(s.name, s.labels.get("outcome")): s.value for s in metric_samples(url)}
    hits = samples.get(("ragsieve_embedding_cache_lookups_total", "hit"))
    misses = samples.get(("ragsieve_embedding_cache_lookups_total", "miss"))
    if hits is None or misses is None:
        return None
    return {"hits": hits, "misses": misses, "hit_ratio": hits / (hits + misses) if hits + misses else 0.0}


def make_requests(n: int, docs: int, seed: int = 0, dataset: str = "nq-oracle") -> list[dict]:
    """Rerank bodies: a question and `docs` passages of ``dataset`` in its length range (DOCUMENT_SOURCES);
    ``trace``: :func:`trace_requests`."""
    if dataset == "trace":
        return trace_requests(n, docs, seed)
    rng = random.Random(seed)
    low, high = DOCUMENT_SOURCES[dataset]
    try:
        from ragsieve.data import load_dataset

        ds = load_dataset(dataset)
        questions = [q.text for q in ds.questions]
        pool = [p.full_text for p in ds.passages if low <= len(p.text.split()) <= high]
        source = dataset
    except Exception as exc:  # noqa: BLE001 - no data here: same shape, synthetic words
        print(f"{dataset} unavailable ({exc}); synthetic passages")
        words = "the of and a in to is was for on as by with he that at from his it an were are which".split()
        questions = [" ".join(rng.choices(words, k=8)) for _ in range(200)]
        pool = [" ".join(rng.choices(words, k=max(low, 100))) for _ in range(2000)]
        source = "synthetic"
    bodies = [{"model": "bench", "query": rng.choice(questions), "documents": rng.sample(pool, docs)} for _ in range(n)]
    return bodies, source


BATCH_SETTINGS = ("max_batch_tokens", "max_slice_tokens", "max_batch_pairs", "max_wait_ms")


def serve_settings(args, workdir: Path) -> tuple[Path, dict]:
    """The `ragsieve serve -c` file holding the batching options given on this command line, and every batching
    setting the server runs with (the ones not given: ServeConfig's defaults, what `ragsieve serve` runs with)."""
    from ragsieve.serve.config import ServeConfig

    given = {k: getattr(args, k) for k in BATCH_SETTINGS if getattr(args, k) is not None}
    path = workdir / "serve.json"
    path.write_text(json.dumps(given))
    effective = ServeConfig(**given)
    return path, {k: getattr(effective, k) for k in BATCH_SETTINGS}


def _die_with_parent() -> None:
    """Child servers get SIGTERM when this process dies, however it dies (no orphaned model servers)."""
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_server(argv: list[str], env: dict | None = None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=REPO,
        preexec_fn=_die_with_parent,
    )
    for line in proc.stdout:  # the server's URL line (Ray may print before it)
        if "http://" in line:
            return proc, line[line.index("http://") :].split()[0]
    proc.kill()
    sys.exit(f"server did not start: {argv}")


def stop_server(proc: subprocess.Popen, timeout: float = 60) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def pairs_in(body: dict) -> int:
    return len(body["documents"])


async def drive(url: str, path: str, bodies: list[dict], clients: int, seconds: float, grace: float,
                size=pairs_in, ramp: float = 0.0, scored: bool = False) -> dict:
    """Closed loop: each client sends its next request when the last one returns, for ``ramp`` + ``seconds``.

    pairs/s counts the pairs (``size(body)``) answered inside the window, which opens ``ramp`` seconds after the
    clients start: all of them start at once, so the first answers come only once the first round of requests has
    been scored (at 50 clients × 20 documents, ~20 s of work), which a window opened at the start would count as
    lost throughput. Requests still in flight at the end get ``grace`` seconds (their latencies count), then are
    cancelled and reported.
    """
    import httpx

    latencies, errors, window_pairs, done = [], 0, 0, 0
    answered: list[tuple[float, int]] = []  # (seconds into the window, pairs) of each in-window answer
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as client:
        # warm-up, not timed: first-call allocations, connection set-up
        await asyncio.gather(*[client.post(path, json=bodies[i % len(bodies)]) for i in range(min(clients, 4))])
        start = time.perf_counter() + ramp
        stop_at = start + seconds

        async def worker(k: int) -> None:
            nonlocal errors, window_pairs, done
            i = k
            while time.perf_counter() < stop_at:
                body = bodies[i % len(bodies)]
                i += clients
                t = time.perf_counter()
                try:
                    r = await client.post(path, json=body)
                    ok = r.status_code == 200
                except (httpx.HTTPError, OSError):
                    ok = False
                end = time.perf_counter()
                if not ok:
                    errors += 1
                    continue
                latencies.append(end - t)
                done += 1
                if start <= end <= stop_at:
                    window_pairs += size(body)
                    answered.append((end - start, size(body)))

        tasks = [asyncio.ensure_future(worker(k)) for k in range(clients)]
        sampler = asyncio.ensure_future(sample_scored(url, start, seconds)) if scored else None
        _, pending = await asyncio.wait(tasks, timeout=ramp + seconds + grace)
        samples = await sampler if sampler is not None else None
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    lat = np.asarray(latencies) * 1000 if latencies else np.full(1, np.nan)
    return {
        "requests": done,
        "errors": errors,
        "unfinished_after_grace": len(pending),
        "window_pairs": window_pairs,
        "seconds": seconds,
        "pairs_per_s": window_pairs / seconds,
        "latency_ms": {
            "p50": float(np.percentile(lat, 50)),
            "p95": float(np.percentile(lat, 95)),
            "p99": float(np.percentile(lat, 99)),
            "max": float(np.max(lat)),
        },
        "latency_ms_ci95": percentile_cis(lat) if latencies else None,
        **rate_ci(answered, seconds),
        # the server's scoring rate over the same window, in 6 slices (unit: a slice)
        **({"scored_pairs_per_s": sum(n for _, n in samples) / seconds,
            **{k.replace("pairs_per_s", "scored_pairs_per_s"): v for k, v in rate_ci(samples, seconds, 6).items()}}
           if samples is not None else {}),
    }


def percentile_cis(lat_ms: np.ndarray, resamples: int = 2000) -> dict:
    """95 % bootstrap intervals of p50/p95/p99 over the answered requests (n = their count)."""
    rng = np.random.default_rng(0)
    draws = rng.choice(lat_ms, size=(resamples, len(lat_ms)), replace=True)
    out: dict = {"n_requests": int(len(lat_ms))}
    for q in (50, 95, 99):
        lo, hi = np.percentile(np.percentile(draws, q, axis=1), [2.5, 97.5])
        out[f"p{q}"] = [float(lo), float(hi)]
    return out


def scored_pairs(url: str) -> float:
    """The server's own count of (query, text) pairs scored so far (``ragsieve_pairs_scored`` on ``/metrics``)."""
    return float(sum(s.value for s in metric_samples(url) if s.name == "ragsieve_pairs_scored_total"))


async def sample_scored(url: str, start: float, seconds: float, bins: int = 6) -> list[tuple[float, int]]:
    """``(seconds into the window, pairs scored since the last sample)`` every ``seconds / bins``: the server's
    scoring rate, which answers arriving in waves of a whole batch do not distort (issue #73)."""
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    last, out = await asyncio.to_thread(scored_pairs, url), []
    for i in range(1, bins + 1):
        await asyncio.sleep(max(0.0, start + i * seconds / bins - time.perf_counter()))
        now = await asyncio.to_thread(scored_pairs, url)
        out.append(((i - 0.5) * seconds / bins, int(now - last)))
        last = now
    return out


def rate_ci(answered: list[tuple[float, int]], seconds: float, bins: int = 3) -> dict:
    """pairs/s in ``bins`` equal slices of the window: their mean's 95 % t-interval (n = bins).

    Slices, not requests, are the unit: answers come in batches, so one request's pairs are not
    independent of its neighbours'. Few slices of a long window, because a batch takes seconds."""
    from scipy import stats

    width = seconds / bins
    counts = np.zeros(bins)
    for t, n in answered:
        counts[min(int(t // width), bins - 1)] += n
    rates = counts / width
    half = float(stats.t.ppf(0.975, bins - 1) * rates.std(ddof=1) / np.sqrt(bins)) if bins > 1 else float("nan")
    return {"pairs_per_s_slices": rates.tolist(),
            "pairs_per_s_ci95": [float(rates.mean() - half), float(rates.mean() + half)]}


def offline(spec: str, bodies: list[dict], max_pairs: int, batch_size: int) -> dict:
    """The served reranker itself, in this process, over the same pairs: what the service is a ratio of."""
    from ragsieve.registry import load_reranker

    ranker = load_reranker(spec)
    pairs = [(b["query"], d) for b in bodies for d in b["documents"]][:max_pairs]

    def score(part):
        return ranker.score_pairs([q for q, _ in part], [d for _, d in part])

    score(pairs[:batch_size])  # warm-up (and the cosine encoder's load, for a mixed reranker)
    t = time.perf_counter()
    score(pairs)
    seconds = time.perf_counter() - t
    return {"spec": spec, "pairs": len(pairs), "seconds": seconds, "pairs_per_s": len(pairs) / seconds}


def offline_predict(model_dir: str, bodies: list[dict], max_pairs: int, batch_size: int) -> dict:
    """``CrossEncoder.predict`` on the cross-encoder folder: the plain library, for reference."""
    from ragsieve.rerank.neural import CrossEncoderRanker

    ranker = CrossEncoderRanker(model_dir, batch_size=batch_size)
    pairs = [(b["query"], d) for b in bodies for d in b["documents"]][:max_pairs]
    ranker.predict_pairs(pairs[:batch_size])  # warm-up
    t = time.perf_counter()
    ranker.predict_pairs(pairs)
    seconds = time.perf_counter() - t
    return {"pairs": len(pairs), "seconds": seconds, "pairs_per_s": len(pairs) / seconds, "batch_size": batch_size}


def plain_server(model_dir: str) -> None:
    """The naive baseline: FastAPI + CrossEncoder.predict per request, in FastAPI's thread pool."""
    import uvicorn
    from fastapi import FastAPI
    from sentence_transformers import CrossEncoder

    from ragsieve.serve.runner import bind

    import torch

    model = CrossEncoder(model_dir, max_length=512, device="cpu", model_kwargs={"dtype": torch.float32})
    app = FastAPI()

    @app.post("/v1/rerank")
    def rerank(body: dict):
        scores = model.predict([(body["query"], d) for d in body["documents"]], batch_size=32, show_progress_bar=False)
        order = np.argsort(-np.asarray(scores))
        return {"results": [{"index": int(i), "relevance_score": float(scores[i])} for i in order]}

    sock = bind("127.0.0.1", 0)
    print(f"plain: http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


def infinity_status() -> str | None:
    """None when infinity-emb can be started here, else why not."""
    try:
        import infinity_emb  # noqa: F401
    except ImportError:
        # pip --dry-run with -c constraints.txt (2026-11-23): the newest release, 0.0.78, needs click<8.2 for its
        # server extra (typer here runs on click 8.5.1); every older one needs numpy<2 (numpy 2.4.6 here).
        return (
            "not installable beside ragsieve: infinity-emb 0.0.78[server] requires click<8.2 (pinned 8.5.1), "
            "all older releases require numpy<2 (pinned 2.4.6); compared against a plain FastAPI + "
            "CrossEncoder.predict server instead"
        )
    return None


def feedback_store(store: str) -> str:
    """A new evolve store for the feedback writes (two seed examples; nothing is trained): a folder or a
    ``postgresql://`` URL, as ``serve --feedback-store`` takes it. One that exists is refused in one line."""
    from ragsieve.data.records import LabeledPair
    from ragsieve.errors import RagsieveError
    from ragsieve.evolve.store import EvolveStoreConfig, init_store
    from ragsieve.prompts.verdicts import get_template

    t = get_template("fever")
    seed = [LabeledPair(f"s{y}", f"s{y}", q, d, y, t.fields_for(q, d), dataset="fever")
            for y, (q, d) in enumerate([("Hamlet is a novel.", "Hamlet is a tragedy."),
                                        ("Paris is in France.", "Paris is the capital of France.")])]
    try:
        init_store(store, EvolveStoreConfig(template="fever"), seed)
    except RagsieveError as exc:  # a store that exists: the bench's rows would train its next round
        sys.exit(f"--feedback-store: {exc}")
    return store


@contextmanager
def shared_store(args, workdir: Path):
    """(the store the replicas share, as ``serve --feedback-store`` takes it; what the JSON says of it).

    ``--postgres`` starts a throwaway server (fsync on: real commits, as in ``bench/feedback_store.py``)
    and stops it on the way out, after the bench's own connections are closed."""
    from ragsieve.evolve_db import close_engines, is_database_url, locate_store, open_database

    server = None
    if args.postgres:
        from tools.postgres import PostgresServer, skip_reason

        if skip_reason():
            sys.exit(f"--postgres: {skip_reason()}")
        server = PostgresServer(fsync=True).start()
        store = server.new_database()
        where = "throwaway PostgreSQL in a temp folder on loopback, fsync on (tools/postgres.py)"
    elif args.feedback_store:
        given = args.feedback_store
        store = given if is_database_url(given) else str(Path(given).resolve())  # the server runs in REPO
        where = "given by --feedback-store"
    else:
        store = str(workdir / "store")
        where = "a temp folder on local disk"
    try:
        feedback_store(store)
        location = locate_store(store)
        info = {"kind": "postgresql" if location.postgres else "sqlite (WAL)", "store": location.label,
                "where": where}
        if location.postgres:  # what the rates depend on, asked of the store's own engine
            from sqlalchemy import text

            with open_database(location).connect() as conn:
                info.update({k: conn.execute(text(f"SHOW {k}")).scalar() for k in ("server_version", "fsync")})
        yield store, info
    finally:
        close_engines()
        if server is not None:
            server.stop()


def _write_loop(store: str, seconds: float, rows_per_call: int) -> list[float]:
    """``append_feedback`` in a loop: one transaction of ``rows_per_call`` rows per call; each call's end time."""
    from ragsieve.evolve.live import FeedbackItem, append_feedback

    items = [FeedbackItem(query="bench query", document=f"bench row {i}", label=i % 2, source="bench")
             for i in range(rows_per_call)]
    ends, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        append_feedback(store, items)
        ends.append(time.perf_counter() - start)
    return ends


def store_write_rate(store: str, seconds: float, rows_per_call: int, writers: int = 1) -> dict:
    """Rows/s the store takes from ``writers`` processes appending at once (as replicas do), with a
    95 % t-interval over half-second slices (n = slices)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(writers) as pool:
        runs = list(pool.map(_write_loop, [str(store)] * writers, [seconds] * writers, [rows_per_call] * writers))
    calls = sum(len(ends) for ends in runs)
    n_slices = max(2, int(seconds * 2))
    slices = rate_ci([(t, rows_per_call) for ends in runs for t in ends], seconds, bins=n_slices)
    return {"writers": writers, "rows_per_call": rows_per_call, "calls": calls, "seconds": seconds,
            "rows_per_s": calls * rows_per_call / seconds,
            "rows_per_s_ci95": slices["pairs_per_s_ci95"], "slices": n_slices}


def ray_bench(args, spec: str, bodies: list[dict], source: str, workdir: Path) -> dict:
    """The same load on 1 and 2 replicas (``ragsieve serve --ray local``), then the feedback writes."""
    with shared_store(args, workdir) as (store, store_info):
        print(f"feedback store: {store_info['kind']}, {store_info['store']}")
        return _ray_runs(args, spec, bodies, source, workdir, store, store_info)


def _ray_runs(args, spec: str, bodies: list[dict], source: str, workdir: Path, store: str, store_info: dict) -> dict:
    from ragsieve.evolve.live import pending_feedback

    cfg, settings = serve_settings(args, workdir)
    cli = "import sys; from ragsieve.cli import main; sys.exit(main(sys.argv[1:]))"
    runs: dict = {}
    feedback_http = None
    for n in args.replicas:
        proc, url = start_server([sys.executable, "-c", cli, "serve", "-r", spec, "--ray", "local", "--replicas",
                                  str(n), "--port", "0", "-c", str(cfg), "--feedback-store", store,
                                  "--log-level", "warning"])
        try:
            runs[str(n)] = asyncio.run(drive(url, "/v1/rerank", bodies, args.clients, args.seconds, args.grace))
            print(f"{n} replica(s): {runs[str(n)]['pairs_per_s']:.1f} pairs/s, "
                  f"p50 {runs[str(n)]['latency_ms']['p50']:.0f} ms, p99 {runs[str(n)]['latency_ms']['p99']:.0f} ms, "
                  f"errors {runs[str(n)]['errors']}")
            if n == args.replicas[-1] and args.feedback_seconds > 0:
                before = pending_feedback(store)
                rows = [{"query": b["query"], "document": d, "label": i % 2, "source": "bench"}
                        for i, b in enumerate(bodies) for d in b["documents"][:1]]
                feedback_http = asyncio.run(drive(url, "/v1/feedback", rows, args.clients, args.feedback_seconds,
                                                  args.grace, size=lambda body: 1))
                # every acknowledged row is in the store (counted by its own reader, on either backend):
                # warm-up rows + answered requests, none lost
                feedback_http["replicas"] = n
                feedback_http["rows_stored"] = pending_feedback(store) - before
                feedback_http["rows_acknowledged"] = feedback_http["requests"] + min(args.clients, 4)
                for rate in ("", "_ci95", "_slices"):  # rows, not pairs, on this path
                    feedback_http[f"rows_per_s{rate}"] = feedback_http.pop(f"pairs_per_s{rate}")
                print(f"feedback over HTTP on {n} replicas: {feedback_http['rows_per_s']:.1f} rows/s, "
                      f"stored {feedback_http['rows_stored']} of {feedback_http['rows_acknowledged']} acknowledged")
        finally:
            stop_server(proc)
    direct = [store_write_rate(store, 4.0, k, w) for k in (1, 100) for w in (1, 2)]
    for d in direct:
        print(f"{store_info['kind']} append_feedback, {d['writers']} writer(s), "
              f"{d['rows_per_call']} row(s)/transaction: "
              f"{d['rows_per_s']:.0f} rows/s (95% CI {d['rows_per_s_ci95'][0]:.0f}-{d['rows_per_s_ci95'][1]:.0f})")
    return {
        "runs": runs,
        "feedback": {"http": feedback_http, "direct": direct, "store": store_info},
        "served_spec": spec,
        "setup": {"clients": args.clients, "seconds": args.seconds, "grace": args.grace, "docs_per_request": args.docs,
                  "source": source, **settings,
                  "model": args.model, "replicas": args.replicas, "feedback_seconds": args.feedback_seconds,
                  "feedback_store": store_info["kind"],
                  "replica_cpus": "the cluster's CPUs shared equally, whole CPUs (ragsieve.serve.ray._replica_cpus)"},
    }


async def _small_requests(url: str, seconds: float, big: dict | None) -> dict:
    """Latency of 1-document requests sent back to back for ``seconds``, with one client sending ``big`` meanwhile
    (a new one as soon as the last is answered)."""
    import httpx

    small = {"query": "who wrote hamlet", "documents": ["Shakespeare wrote Hamlet around 1600."]}
    latencies, errors, stop, big_answered = [], 0, asyncio.Event(), 0
    async with httpx.AsyncClient(timeout=600) as client:
        async def big_client() -> None:
            nonlocal big_answered
            while not stop.is_set():
                try:
                    big_answered += (await client.post(f"{url}/v1/rerank", json=big)).status_code == 200
                except httpx.HTTPError:
                    pass

        hog = asyncio.create_task(big_client()) if big else None
        if hog is not None:
            await asyncio.sleep(5)  # the big request is planned and scoring
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            r = await client.post(f"{url}/v1/rerank", json=small)
            latencies.append((time.perf_counter() - start) * 1000)
            errors += r.status_code != 200
        stop.set()
        if hog is not None:
            hog.cancel()
    lat = np.array(latencies)
    return {"requests": len(lat), "errors": errors, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "max_ms": float(lat.max()), "ci95_ms": percentile_cis(lat),
            **({"big_requests_answered": big_answered} if big else {})}


def fairness(args, spec: str) -> None:
    """Small requests alone, then beside a client streaming 2 MB requests, then the replayed RAG trace at
    ``--clients``: all on one server at the default settings, with the same reranker offline on the trace's pairs
    measured first (the ratio's denominator), so both targets are read from one run."""
    rng = random.Random(0)
    words = "the river city king war music paris hamlet shakespeare wrote tragedy play moon history".split()
    big = {"query": "who wrote hamlet", "documents": [" ".join(rng.choices(words, k=9_000))[:49_000]
                                                      for _ in range(40)]}
    bodies, source = trace_requests(args.requests, args.docs)
    off = offline(spec, bodies, args.offline_pairs, args.batch_size)
    print(f"offline {spec} on the trace: {off['pairs_per_s']:.1f} pairs/s")
    cli = "import sys; from ragsieve.cli import main; sys.exit(main(sys.argv[1:]))"
    workdir = Path(tempfile.mkdtemp(prefix="bench-fair-"))
    cfg, settings = serve_settings(args, workdir)
    proc, url = start_server([sys.executable, "-c", cli, "serve", "-r", spec, "--port", "0", "-c", str(cfg),
                              "--log-level", "warning"])
    try:
        alone = asyncio.run(_small_requests(url, args.small_seconds, None))
        beside_big = asyncio.run(_small_requests(url, args.seconds, big))
        print(f"1-document requests: alone p99 {alone['p99_ms']:.0f} ms; beside 2 MB requests p50 "
              f"{beside_big['p50_ms']:.0f} ms, p99 {beside_big['p99_ms']:.0f} ms")
        trace = asyncio.run(drive(url, "/v1/rerank", bodies, args.clients, args.seconds, args.grace,
                                  ramp=args.ramp, scored=True))
        trace["embedding_cache"] = cache_counts(url)
    finally:
        stop_server(proc, timeout=120)
    trace["ratio_to_offline"] = trace["pairs_per_s"] / off["pairs_per_s"]
    # the server's own scoring rate over the window: answers arriving in waves of a batch do not move it
    trace["scored_ratio_to_offline"] = trace["scored_pairs_per_s"] / off["pairs_per_s"]
    trace["scored_ratio_to_offline_ci95"] = [x / off["pairs_per_s"] for x in trace["scored_pairs_per_s_ci95"]]
    print(f"trace replay at {args.clients} clients: {trace['pairs_per_s']:.1f} pairs/s answered, "
          f"{trace['scored_pairs_per_s']:.1f} scored; ratios {trace['ratio_to_offline']:.2f} / "
          f"{trace['scored_ratio_to_offline']:.2f} to offline")
    result = {"small_alone": alone, "small_beside_one_big_client": beside_big, "trace": trace, "trace_offline": off,
              "ratio_to_offline": trace["ratio_to_offline"], "served_spec": spec,
              "targets": {"small_beside_big_p99_ms": 1000, "trace_ratio_to_offline": 0.9},
              "setup": {"seconds": args.seconds, "small_alone_seconds": args.small_seconds, "ramp_seconds": args.ramp,
                        **settings,
                        "big_request": "40 documents x 49,000 characters (~2 MB)", "small_request": "1 document",
                        "trace": {"clients": args.clients, "docs_per_request": args.docs, "source": source,
                                  "bodies": len(bodies)}},
              "machine": machine_info(),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    out = Path(args.out or "bench/results/serve_fairness.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"small_beside_big_p99_ms": beside_big["p99_ms"], "trace_ratio": trace["ratio_to_offline"]}))


def filter_bench(args) -> None:
    """/v1/filter of a sieve that prunes (``--sieve``, default the shipped one: rerank → top_k → keep head), at
    ``--clients`` on the replayed trace's requests, against ``Sieve.filter`` offline on the same requests one after
    another; documents per second both ways. Writes ``bench/results/serve_filter.json``."""
    from ragsieve.pipeline import Sieve
    from ragsieve.serve.config import ServeConfig

    bodies, source = trace_requests(args.requests, args.docs)
    sieve = Sieve.load(args.sieve)
    sieve.filter(bodies[0]["query"], bodies[0]["documents"])  # warm-up: every model loads
    done, start = 0, time.perf_counter()
    for body in bodies[: args.offline_requests]:
        pruned = sieve.filter(body["query"], body["documents"]).pruned
        done += len(body["documents"])
    seconds = time.perf_counter() - start
    off = {"sieve": args.sieve, "requests": args.offline_requests, "documents": done, "seconds": seconds,
           "documents_per_s": done / seconds, "pruned_last": len(pruned)}
    print(f"offline Sieve.filter: {off['documents_per_s']:.1f} documents/s")
    workdir = Path(tempfile.mkdtemp(prefix="bench-filter-"))
    cfg, settings = serve_settings(args, workdir)
    # the sieve's stages as plain specs (what `ragsieve serve --sieve` serves), without the LLM /v1/filter never uses
    stages = ServeConfig(sieve=args.sieve).expanded().model_dump(exclude={"api_key", "sieve", "llm", "probe"},
                                                                   exclude_defaults=True)
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), **stages}))
    cli = "import sys; from ragsieve.cli import main; sys.exit(main(sys.argv[1:]))"
    proc, url = start_server([sys.executable, "-c", cli, "serve", "--port", "0", "-c", str(cfg),
                              "--log-level", "warning"])
    try:
        served = asyncio.run(drive(url, "/v1/filter", bodies, args.clients, args.seconds, args.grace,
                                   ramp=args.ramp))
    finally:
        stop_server(proc, timeout=120)
    served["documents_per_s"] = served["pairs_per_s"]  # drive counts a request's documents
    served["ratio_to_offline"] = served["documents_per_s"] / off["documents_per_s"]
    print(f"/v1/filter at {args.clients} clients: {served['documents_per_s']:.1f} documents/s, "
          f"ratio {served['ratio_to_offline']:.2f}, errors {served['errors']}")
    result = {"ratio_to_offline": served["ratio_to_offline"], "target_ratio_to_offline": 0.9, "served": served,
              "offline": off, "served_stages": stages,
              "setup": {"clients": args.clients, "seconds": args.seconds, "ramp_seconds": args.ramp,
                        "docs_per_request": args.docs, "source": source, "bodies": len(bodies), **settings},
              "machine": machine_info(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    out = Path(args.out or "bench/results/serve_filter.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"ratio_to_offline": served["ratio_to_offline"], "errors": served["errors"]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default",
                        help="default (what `ragsieve serve` serves), a reranker spec, a cross-encoder folder "
                             "or minilm")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--grace", type=float, default=60.0, help="seconds in-flight requests may finish in")
    parser.add_argument("--docs", type=int, default=20)
    parser.add_argument("--documents", choices=sorted(DOCUMENT_SOURCES), default="nq-oracle",
                        help="where documents come from: multirc's are longer than the default's window "
                        "(writes serve_long.json); trace: a replayed RAG trace (serve_trace.json)")
    parser.add_argument("--requests", type=int, default=400, help="distinct request bodies, cycled")
    parser.add_argument("--offline-pairs", type=int, default=2000)
    parser.add_argument("--max-batch-tokens", type=int, default=None, help="default: ServeConfig's")
    parser.add_argument("--max-slice-tokens", type=int, default=None, help="default: ServeConfig's")
    parser.add_argument("--max-batch-pairs", type=int, default=None, help="default: ServeConfig's")
    parser.add_argument("--fairness", action="store_true",
                        help="small requests' p50/p99 alone and beside one client sending 2 MB requests, then the "
                             "trace replay's ratio to offline, on one server (serve_fairness.json)")
    parser.add_argument("--small-seconds", type=float, default=20.0, help="with --fairness: small requests alone")
    parser.add_argument("--ramp", type=float, default=30.0,
                        help="with --fairness and --filter: seconds the clients run before the window opens")
    parser.add_argument("--filter", action="store_true",
                        help="/v1/filter of a pruning sieve vs Sieve.filter offline on the trace (serve_filter.json)")
    parser.add_argument("--sieve", default="embedded:default", help="with --filter: the sieve served")
    parser.add_argument("--offline-requests", type=int, default=60, help="with --filter: requests run offline")
    parser.add_argument("--max-wait-ms", type=float, default=None, help="default: ServeConfig's")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--skip-baseline", action="store_true", help="only ragsieve serve and offline scoring")
    parser.add_argument("--ray", action="store_true", help="serve on Ray Serve (1 then 2 replicas) instead")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2], help="with --ray: replica counts to run")
    parser.add_argument("--feedback-seconds", type=float, default=10.0,
                        help="with --ray: seconds of POST /v1/feedback load on the last deployment (0 = skip)")
    stores = parser.add_mutually_exclusive_group()
    stores.add_argument("--feedback-store", default=None, metavar="DIR|URL",
                        help="with --ray: the feedback store the replicas share, as `ragsieve serve "
                             "--feedback-store` takes it (a folder or a postgresql:// URL; created here, so it must "
                             "not hold a store yet); default a SQLite store in a temp folder")
    stores.add_argument("--postgres", action="store_true",
                        help="with --ray: the feedback store in a throwaway PostgreSQL (tools/postgres.py, fsync on) "
                             "started for the run and stopped after it")
    parser.add_argument("--out", default=None, help="default bench/results/serve.json (serve_ray.json with --ray, "
                                                    "serve_ray_postgres.json with its store on PostgreSQL)")
    parser.add_argument("--plain-server", default=None, help=argparse.SUPPRESS)  # internal: run the baseline server
    args = parser.parse_args()
    if (args.feedback_store or args.postgres) and not args.ray:
        parser.error("--feedback-store and --postgres go with --ray (the single-process run writes no feedback)")
    if args.plain_server:
        return plain_server(args.plain_server)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop the servers
    import torch

    workdir = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    spec, model_dir = resolve_model(args.model, workdir)
    if args.fairness:
        return fairness(args, spec)
    if args.filter:
        return filter_bench(args)
    bodies, source = make_requests(args.requests, args.docs, dataset=args.documents)
    print(f"{len(bodies)} request bodies of {args.docs} documents from {source}; serving {spec}")
    if args.ray:
        result = ray_bench(args, spec, bodies, source, workdir)
        result.update({"errors": sum(run["errors"] for run in result["runs"].values()),
                       "torch_threads": torch.get_num_threads(),
                       "machine": machine_info(),
                       "date": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        postgres = result["feedback"]["store"]["kind"] == "postgresql"
        out = Path(args.out or f"bench/results/serve_ray{'_postgres' if postgres else ''}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({n: run["pairs_per_s"] for n, run in result["runs"].items()} | {"errors": result["errors"]}))
        return

    # offline first, while nothing else of ours runs
    off = offline(spec, bodies, args.offline_pairs, args.batch_size)
    print(f"offline {spec}: {off['pairs_per_s']:.1f} pairs/s")
    off_predict = offline_predict(model_dir, bodies, args.offline_pairs, args.batch_size) if model_dir else None
    if off_predict:
        print(f"offline CrossEncoder.predict on {model_dir}: {off_predict['pairs_per_s']:.1f} pairs/s")

    cfg, settings = serve_settings(args, workdir)
    cli = "import sys; from ragsieve.cli import main; sys.exit(main(sys.argv[1:]))"
    proc, url = start_server(
        [
            sys.executable,
            "-c",
            cli,
            "serve",
            "-r",
            spec,
            "--port",
            "0",
            "-c",
            str(cfg),
            "--log-level",
            "warning",
        ]
    )
    try:
        served = asyncio.run(drive(url, "/v1/rerank", bodies, args.clients, args.seconds, args.grace))
        served["embedding_cache"] = cache_counts(url)
    finally:
        stop_server(proc)
    served["ratio_to_offline"] = served["pairs_per_s"] / off["pairs_per_s"]
    print(
        f"ragsieve serve: {served['pairs_per_s']:.1f} pairs/s, p50 {served['latency_ms']['p50']:.0f} ms, "
        f"p99 {served['latency_ms']['p99']:.0f} ms, errors {served['errors']}, ratio {served['ratio_to_offline']:.2f}"
    )

    comparison: dict = {"infinity_emb": infinity_status()}
    if not args.skip_baseline and model_dir:
        proc, url = start_server([sys.executable, str(Path(__file__).resolve()), "--plain-server", model_dir])
        try:
            plain = asyncio.run(drive(url, "/v1/rerank", bodies, args.clients, args.seconds, args.grace))
        finally:
            stop_server(proc)
        comparison["plain_fastapi_crossencoder_predict"] = plain
        # a plain server may answer nothing in the window (one predict per request thread, all at once)
        ratio = served["pairs_per_s"] / plain["pairs_per_s"] if plain["pairs_per_s"] else None
        comparison["ratio_ragsieve_to_plain"] = ratio
        print(
            f"plain FastAPI + predict: {plain['pairs_per_s']:.1f} pairs/s, p99 {plain['latency_ms']['p99']:.0f} ms, "
            f"errors {plain['errors']}; ragsieve/plain {'n/a' if ratio is None else f'{ratio:.2f}'}"
        )

    result = {
        "pairs_per_s": served["pairs_per_s"],
        "latency_ms": served["latency_ms"],
        "errors": served["errors"],
        "ratio_to_offline": served["ratio_to_offline"],
        "target_ratio_to_offline": 0.9,
        "target_ratio_to_infinity": 1.0,
        "served": served,
        "offline": off,
        "offline_crossencoder_predict": off_predict,
        "served_spec": spec,
        "comparison": comparison,
        "setup": {
            "clients": args.clients,
            "seconds": args.seconds,
            "docs_per_request": args.docs,
            "source": source,
            "words_per_document": DOCUMENT_SOURCES[args.documents],
            **settings,
            "model": args.model,
        },
        "torch_threads": torch.get_num_threads(),
        "machine": machine_info(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    suffix = {"multirc": "_long", "trace": "_trace"}.get(args.documents, "")
    out = Path(args.out or f"bench/results/serve{suffix}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("pairs_per_s", "errors", "ratio_to_offline")}))


if __name__ == "__main__":
    main()
