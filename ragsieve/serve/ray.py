"""``ragsieve serve --ray``: N replicas of the same FastAPI app on Ray Serve.

Each replica is the app :func:`~ragsieve.serve.app.create_app` builds (``@serve.ingress``,
built in the replica), holding its own models. What differs from one uvicorn process:

- **Batching** is Ray Serve's ``@serve.batch`` (:class:`ServeBatcher`) instead of the
  worker-thread :class:`~ragsieve.serve.batcher.PairBatcher`; both score a batch with
  :func:`~ragsieve.serve.batcher.score_jobs`, the same ``score_pairs`` call.
- **/admin/reload reaches every replica.** One named actor per app (:class:`ReloadVersions`)
  holds a version number. The replica that gets the request bumps it and reloads; every
  replica polls it every ``reload_poll_s`` and reloads when it is behind, then reports the
  version it serves. The request returns once every live replica (one that polled in the
  last few intervals) serves the new version. A replica that starts later (Ray Serve
  replacing a dead one) loads the specs as they are now, so it is never behind.
- **Feedback** goes to the one store in ``feedback_store`` that every replica writes: a
  SQLite file (WAL: concurrent writers on one machine wait, none is lost) or any URL the
  store accepts (the value is passed through untouched).

Requests reach the replicas through Ray Serve's HTTP proxy on ``host:port``.

Needs the optional extra ``ragsieve[ray]``. Example (a local Ray instance, two replicas)::

    from ragsieve.serve import ServeConfig
    from ragsieve.serve.ray import serve_on_ray

    url = serve_on_ray(ServeConfig(reranker="bm25", feedback_store="store/"), replicas=2, port=8080)
    # POST {url}/v1/rerank ... ; POST {url}/admin/reload reloads both replicas
    from ray import serve; serve.shutdown()

or deploy the application yourself: ``serve.run(deployment(config, replicas=4), name="ragsieve")``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragsieve.errors import RagsieveError
from ragsieve.rerank.base import BaseRanker
from ragsieve.serve.batcher import BatchStats, score_jobs
from ragsieve.serve.config import ServeConfig
from ragsieve.serve.errors import ServeError
from ragsieve.specs import is_url

if TYPE_CHECKING:
    from ray.serve import Application

    from ragsieve.serve.metrics import ServeMetrics

log = logging.getLogger("ragsieve.serve")

APP_NAME = "ragsieve"  # the Serve application (and deployment) name
RELOAD_NAMESPACE = "ragsieve"  # Ray namespace of the per-app ReloadVersions actor
RELOAD_TIMEOUT_S = 300.0  # how long /admin/reload waits for the other replicas to load the new models


def _ray_serve():
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise RagsieveError("--ray needs Ray Serve: pip install 'ragsieve[ray]'") from exc
    return ray, serve


#: this process's ``@serve.batch`` queues, one per (model slot, batch settings): see :func:`_batch_lane`
_LANES: dict[tuple[str, int, float], Any] = {}


def _batch_lane(name: str, max_batch_pairs: int, max_wait_ms: float):
    """The replica's one ``@serve.batch`` queue for the model slot ``name``, shared by the
    :class:`ServeBatcher` each reload makes for that slot.

    Why one per slot and not one per batcher: a ``@serve.batch`` queue starts a loop task on first
    use that Ray Serve never stops; a queue per reload left that task, the queue and (through the
    batch function) the old model behind until Python's cycle collector found them, destroying a
    pending task on the way. A lane's items are ``(batcher, pairs)``; a batch may hold jobs of a
    reload's old and new batchers, and each batcher's jobs are scored by its own ranker.
    """
    key = (name, max_batch_pairs, max_wait_ms)
    if key in _LANES:
        return _LANES[key]
    _, serve = _ray_serve()

    def batch_pairs(jobs: list[tuple["ServeBatcher", list[tuple[str, str]]]]) -> int:
        # ServeBatcher sends slices of at most max_batch_pairs, so no item is larger than a batch
        return sum(min(len(pairs), max_batch_pairs) for _, pairs in jobs)

    async def score_batch(jobs: list[tuple["ServeBatcher", list[tuple[str, str]]]]) -> list[np.ndarray | Exception]:
        by_batcher: dict[ServeBatcher, list[int]] = {}
        for i, (batcher, _) in enumerate(jobs):
            by_batcher.setdefault(batcher, []).append(i)
        results: list[np.ndarray | Exception] = [np.zeros(0)] * len(jobs)
        for batcher, positions in by_batcher.items():
            own = [jobs[i][1] for i in positions]
            batcher.stats.record([len(pairs) for pairs in own])
            if batcher.metrics is not None:
                n = sum(len(pairs) for pairs in own)
                batcher.metrics.batch_pairs.labels(model=name).observe(n)
                batcher.metrics.pairs_scored.labels(model=name).inc(n)
            # Serve fails every request of a batch whose function raises: score_jobs returns a failed
            # job's exception in its place instead, and ServeBatcher.score raises it for that job only
            for i, result in zip(positions, await asyncio.to_thread(score_jobs, batcher.ranker, own)):
                results[i] = result
        return results

    score_batch.__name__ = f"score_{name}"  # Serve tags its batch metrics with it
    _LANES[key] = serve.batch(
        max_batch_size=max_batch_pairs, batch_wait_timeout_s=max_wait_ms / 1000.0, batch_size_fn=batch_pairs
    )(score_batch)
    return _LANES[key]


class ServeBatcher:
    """:class:`~ragsieve.serve.batcher.PairBatcher`'s interface on Ray Serve's ``@serve.batch``.

    A batch holds at most ``max_batch_pairs`` pairs and waits at most ``max_wait_ms`` for company;
    one batch runs at a time, off the event loop. A request's pairs go in slices of at most
    ``max_batch_pairs``, the next slice queued once the last is scored: each request has one slice
    in the queue at a time, so requests take turns and a small one waits for at most a slice of a big one.
    The queue belongs to the model slot (``name``), not to the batcher: the batchers a reload
    makes share it (:func:`_batch_lane`), each with its own ranker and stats. Must be used
    inside a replica.

    Example (inside a Serve replica)::

        batcher = ServeBatcher(load_reranker("bm25"), max_wait_ms=5, max_batch_pairs=256)
        scores = await batcher.score([("who wrote hamlet", "Shakespeare wrote Hamlet.")])
    """

    def __init__(self, ranker: BaseRanker, *, max_wait_ms: float = 5.0, max_batch_pairs: int = 32,
                 max_batch_tokens: int | None = None, max_slice_tokens: int | None = None, name: str = "model",
                 metrics: "ServeMetrics | None" = None):
        # the token budgets are PairBatcher's; @serve.batch counts items, so a batch here is max_batch_pairs
        _ray_serve()
        self.ranker = ranker
        self.stats = BatchStats()
        self.metrics = metrics
        self.name = name
        self.max_batch_pairs = max_batch_pairs
        self._closed = False
        self._lane = (name, max_batch_pairs, max_wait_ms)

    async def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Scores of ``pairs`` (in order), computed in a shared batch off the event loop."""
        if not pairs:
            return np.zeros(0, dtype=float)
        if self._closed:
            raise ServeError(503, "the model was just reloaded; retry the request")
        lane, pairs, scores = _batch_lane(*self._lane), list(pairs), []
        left = len(pairs)
        queued = time.perf_counter()
        gauges = None if self.metrics is None else (self.metrics.queue_requests.labels(model=self.name),
                                                    self.metrics.queue_pairs.labels(model=self.name))
        if gauges:
            gauges[0].inc()
            gauges[1].inc(len(pairs))
        try:
            for lo in range(0, len(pairs), self.max_batch_pairs):
                piece = pairs[lo: lo + self.max_batch_pairs]
                result = await lane((self, piece))
                left -= len(piece)
                if gauges:
                    gauges[1].dec(len(piece))
                if lo == 0 and self.metrics is not None:  # here: the wait plus the first slice's scoring
                    self.metrics.queue_wait.labels(model=self.name).observe(time.perf_counter() - queued)
                if isinstance(result, Exception):
                    raise result
                scores.append(result)
        finally:
            if gauges:
                gauges[0].dec()
                gauges[1].dec(left)
        return np.concatenate(scores)

    def close(self) -> None:
        """Refuse new work; what is queued is still scored (the ranker lives as long as its batches)."""
        self._closed = True


class ReloadVersions:
    """One per application (a named Ray actor): the model version every replica should serve,
    and the version each replica last said it serves (with when it said so)."""

    def __init__(self) -> None:
        self.version = 0
        self.seen: dict[str, tuple[float, int]] = {}

    def bump(self) -> int:
        self.version += 1
        return self.version

    def sync(self, replica: str, serving: int) -> int:
        """``replica`` serves ``serving``; returns the version it should serve."""
        self.seen[replica] = (time.monotonic(), serving)
        return self.version

    def live(self, within_s: float) -> dict[str, int]:
        """The replicas heard from in the last ``within_s`` seconds and the version each serves."""
        now = time.monotonic()
        self.seen = {r: (t, v) for r, (t, v) in self.seen.items() if now - t <= max(within_s, 600.0)}
        return {r: v for r, (t, v) in self.seen.items() if now - t <= within_s}


def reload_versions(app_name: str = APP_NAME):
    """The :class:`ReloadVersions` actor of ``app_name`` (created on first use, shared by its replicas)."""
    ray, _ = _ray_serve()
    actor = ray.remote(num_cpus=0)(ReloadVersions)
    return actor.options(
        name=f"reload-versions:{app_name}", namespace=RELOAD_NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote()


class Replica:
    """One replica: the served state (models batched by :class:`ServeBatcher`) and the app around it.

    Wrapped by :func:`deployment` with ``serve.ingress()`` (the app is built in the replica,
    by ``__serve_build_asgi_app__``) and ``serve.deployment``.
    """

    async def __init__(self, config: ServeConfig, reload_poll_s: float = 0.5):
        from ray import serve

        from ragsieve.serve.state import ServeState

        context = serve.get_replica_context()
        self.id = context.replica_id.unique_id
        self.poll_s = reload_poll_s
        self.versions = reload_versions(context.app_name)
        # read before loading: a reload bumped during the load is seen by the first poll
        self.serving = await self.versions.sync.remote(self.id, 0)
        self.state = await asyncio.to_thread(ServeState.load, config, None, ServeBatcher)
        self.state.replica = self.id
        self.state.metrics.on_replica(self.id)
        self.state.reload_everywhere = self.reload_everywhere
        self._lock = asyncio.Lock()
        await self.versions.sync.remote(self.id, self.serving)
        self._follower = asyncio.get_running_loop().create_task(self._follow())

    def __serve_build_asgi_app__(self):
        from ragsieve.serve.app import create_app

        # Serve's proxy sets x-request-id on every response: the Guard must not add a second one
        return create_app(self.state.config, state=self.state, echo_request_id=False)

    async def _reload_to(self, version: int) -> None:
        async with self._lock:  # a poll and a request may both ask: the models load once
            if self.serving < version:
                loading = asyncio.ensure_future(self.state.reload())
                while not loading.done():  # still here, still on the old models: a reload waits for us
                    await self.versions.sync.remote(self.id, self.serving)
                    await asyncio.wait({loading}, timeout=self.poll_s)
                loading.result()  # a failed load raises here, and this replica stays on the old models
                self.serving = version
                log.info("replica %s serves model version %d", self.id, version)
        await self.versions.sync.remote(self.id, self.serving)

    async def _follow(self) -> None:
        """Every ``poll_s``: say which version this replica serves; reload when it is behind."""
        failures = 0
        while True:
            try:
                version = await self.versions.sync.remote(self.id, self.serving)
                if version > self.serving:
                    await self._reload_to(version)
                failures = 0
            except Exception:  # noqa: BLE001 - a failed reload or a lost actor: log it, try again later
                failures += 1
                log.exception("replica %s: following reloads (failure %d)", self.id, failures)
            # after failures (a spec that no longer loads), wait longer before loading it again
            await asyncio.sleep(self.poll_s * min(2**failures, 120))

    async def reload_everywhere(self) -> int:
        """Bump the version, reload here, wait for every live replica to serve it; how many do."""
        version = await self.versions.bump.remote()
        await self._reload_to(version)
        deadline = time.monotonic() + RELOAD_TIMEOUT_S
        while True:
            live = await self.versions.live.remote(4 * self.poll_s + 1.0)
            behind = [r for r, v in live.items() if v < version]
            if not behind:
                return len(live)
            if time.monotonic() > deadline:
                raise ServeError(503, f"reloaded {len(live) - len(behind)} of {len(live)} replicas in "
                                      f"{RELOAD_TIMEOUT_S:.0f} s; the others reload when their load finishes")
            await asyncio.sleep(self.poll_s / 2)

    async def batch_loops(self) -> tuple[str, int]:
        """(this replica's id, how many ``@serve.batch`` loops run in it): one per batched model, however
        often it reloaded. For checks and debugging, through a handle:
        ``serve.get_app_handle("ragsieve").batch_loops.remote().result()``."""
        loops = [t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "").endswith(
            "_process_batches")]
        return self.id, len(loops)

    def __del__(self):
        follower = getattr(self, "_follower", None)
        if follower is not None:
            follower.cancel()


def _replica_cpus(replicas: int) -> float:
    """An equal share of the cluster's CPUs per replica, at most one node's worth (a replica runs on one
    node) and at least one CPU (a fraction when the cluster has fewer CPUs than replicas).

    Why not one CPU each: Ray sets a replica's torch/OpenMP threads from its CPUs, so a single replica
    on a 2-CPU machine would score with one thread and leave a core idle.
    """
    ray, _ = _ray_serve()
    total = float(ray.cluster_resources().get("CPU", 1.0))
    per_node = max((float(n["Resources"].get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")), default=total)
    share = total / replicas
    return float(max(1, min(int(share), int(per_node)))) if share >= 1 else share


def deployment(
    config: ServeConfig,
    *,
    replicas: int = 2,
    replica_cpus: float | None = None,
    reload_poll_s: float = 0.5,
    health_check_period_s: float = 2.0,
) -> "Application":
    """The Ray Serve application: ``replicas`` copies of the app for ``config``.

    ``replica_cpus``: the CPUs each replica reserves (None: an equal share of the cluster's,
    whole CPUs, at most one node's; see :func:`_replica_cpus`). Needs a connected Ray (``ray.init``).
    """
    if replicas < 1:
        raise RagsieveError(f"--replicas {replicas}: at least 1")
    ray, serve = _ray_serve()
    if not ray.is_initialized():
        raise RagsieveError("deployment() needs a running Ray: ray.init() or serve_on_ray()")
    cpus = replica_cpus if replica_cpus is not None else _replica_cpus(replicas)
    ingress = serve.ingress()(Replica)  # no app here: each replica builds its own around its models
    return serve.deployment(
        ingress,
        name=APP_NAME,
        num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus},
        # a batch fills by pairs and a request carries at least one: a replica that may hold
        # max_batch_pairs requests at once can always fill a batch
        max_ongoing_requests=config.max_batch_pairs,
        health_check_period_s=health_check_period_s,
    ).bind(config, reload_poll_s)


def _local_path(value: str | None) -> str | None:
    """An existing relative path made absolute (replicas may not share the caller's working folder);
    anything else (a URL, a registry name) passes through untouched."""
    if value and not is_url(value) and Path(value).exists():
        return str(Path(value).resolve())
    return value


def serve_on_ray(
    config: ServeConfig,
    *,
    address: str = "local",
    replicas: int = 2,
    host: str = "127.0.0.1",
    port: int = 8080,
    num_cpus: int | None = None,
    **options: Any,
) -> str:
    """Deploy ``replicas`` of the app on Ray Serve behind its HTTP proxy; returns the URL.

    ``address``: ``local`` starts a Ray instance here (``num_cpus`` caps it), anything else
    is a cluster address. ``port=0`` takes a free port. ``options`` go to :func:`deployment`.
    """
    from ragsieve.cluster import init_ray
    from ragsieve.serve.runner import bind

    _, serve = _ray_serve()
    config = config.model_copy(update={k: _local_path(getattr(config, k))
                                       for k in ("sieve", "index", "grader", "feedback_store")})
    init_ray(address, num_cpus=num_cpus)
    free = port == 0
    for attempt in range(3 if free else 1):
        if free:
            with bind(host, 0) as sock:  # Serve's proxy needs a number; a free one, released just before it binds
                port = sock.getsockname()[1]
        try:
            serve.start(http_options={"host": host, "port": port})
            serve.run(deployment(config, replicas=replicas, **options), name=APP_NAME, route_prefix="/")
            break
        except Exception as exc:  # noqa: BLE001 - Ray wraps the proxy's bind error in its own task error
            # Ray's own processes take ephemeral ports too: one can take the free port between the pick and
            # the proxy's bind (seen once in CI); a port chosen here is picked again, a given one is not
            if not free or attempt == 2 or "Failed to bind" not in str(exc):
                raise
            log.warning("serve on ray: port %d was taken before the proxy bound it; trying another", port)
            serve.shutdown()
    return f"http://{host}:{port}"
