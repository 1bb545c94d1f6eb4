"""Dynamic batching: concurrent requests share one ``score_pairs`` call on a worker thread.

The event loop never runs the model. Each request's (query, text) pairs go into a queue;
when the worker is idle it waits at most ``max_wait_ms`` for company. Every model call
holds at most ``max_batch_pairs`` pairs, taken round-robin across the waiting requests:
from those not yet served this round (new arrivals join it), and once none is left, a new
round of those still unfinished. A big request is scored a slice at a time, and a small one
sent meanwhile waits for at most the slice being scored. A model error in a shared batch is retried per job, so
one bad request cannot fail the others it was batched with.

Example::

    batcher = PairBatcher(load_reranker("bm25"), max_wait_ms=5, max_batch_pairs=32)
    scores = await batcher.score([("who wrote hamlet", "Shakespeare wrote Hamlet.")])
    batcher.close()

On Ray Serve (:mod:`ragsieve.serve.ray`) ``@serve.batch`` does the queueing instead; both
score a batch with :func:`score_jobs`, so the model call and the per-job retry have one home.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ragsieve.rerank.base import BaseRanker

if TYPE_CHECKING:
    from ragsieve.serve.metrics import ServeMetrics

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Job:
    pairs: Sequence[tuple[str, str]]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    queued_at: float = field(default_factory=time.perf_counter)
    taken: int = 0  # pairs handed to the model so far (a prefix: slices are taken in order)
    scores: list[np.ndarray] = field(default_factory=list)
    failed: bool = False

    @property
    def remaining(self) -> int:
        return len(self.pairs) - self.taken

    def gone(self) -> bool:
        """The request was cancelled (client gone, server shutting down) or already failed: skip its pairs."""
        return self.failed or self.future.cancelled()


@dataclass
class BatchStats:
    batches: int = 0
    jobs: int = 0
    pairs: int = 0
    max_batch_jobs: int = 0

    def record(self, job_sizes: Sequence[int]) -> None:
        """One batch of ``len(job_sizes)`` jobs holding these many pairs each."""
        self.batches += 1
        self.jobs += len(job_sizes)
        self.pairs += sum(job_sizes)
        self.max_batch_jobs = max(self.max_batch_jobs, len(job_sizes))


class Batcher(Protocol):
    """What a request handler awaits: :class:`PairBatcher` here, ``ServeBatcher`` on Ray Serve."""

    stats: BatchStats

    async def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray: ...

    def close(self) -> None: ...


def score_jobs(ranker: BaseRanker, jobs: Sequence[Sequence[tuple[str, str]]]) -> list[np.ndarray | Exception]:
    """Each job's scores from ONE ``score_pairs`` call over all their pairs, in job order.

    When that call fails, each job is scored on its own, so one bad request cannot fail the
    others it was batched with: a job whose own call fails gets its exception in its place.

    Example::

        score_jobs(load_reranker("bm25"), [[("q", "a"), ("q", "b")], [("r", "c")]])   # [array(2), array(1)]
    """
    pairs = [p for job in jobs for p in job]
    try:
        scores = np.asarray(ranker.score_pairs([q for q, _ in pairs], [t for _, t in pairs]), dtype=float)
    except Exception as exc:  # noqa: BLE001 - handed to the awaiting request(s)
        if len(jobs) > 1:  # find the culprit: score each job on its own
            return [result for job in jobs for result in score_jobs(ranker, [job])]
        return [exc]
    results, lo = [], 0
    for job in jobs:
        results.append(scores[lo : lo + len(job)])
        lo += len(job)
    return results


class PairBatcher:
    """One worker thread per model; :meth:`score` is awaited from request handlers."""

    def __init__(
        self, ranker: BaseRanker, *, max_wait_ms: float = 5.0, max_batch_pairs: int = 32, name: str = "model",
        metrics: "ServeMetrics | None" = None,
    ):
        self.ranker = ranker
        self.max_wait = max_wait_ms / 1000.0
        self.max_batch_pairs = max_batch_pairs
        self.stats = BatchStats()
        self.name = name
        self.metrics = metrics
        # the worker's round: jobs not served yet in it (arrivals join), then those already served
        self._unserved: deque[_Job] = deque()
        self._served: deque[_Job] = deque()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        # a job queued after the stop marker would never be answered: closing and queuing exclude each other
        self._closed = False
        self._gate = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"ragsieve-{name}", daemon=True)
        self._thread.start()

    async def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Scores of ``pairs`` (in order), computed in a shared batch off the event loop."""
        if not pairs:
            return np.zeros(0, dtype=float)
        loop = asyncio.get_running_loop()
        job = _Job(list(pairs), loop.create_future(), loop)
        with self._gate:
            if self._closed:
                from ragsieve.serve.errors import ServeError

                raise ServeError(503, "the model was just reloaded; retry the request")
            self._queue.put(job)
        return await job.future

    def close(self) -> None:
        """Answer every job queued so far, then stop the worker."""
        with self._gate:
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout=10)

    # -- worker thread ---------------------------------------------------------------
    def _admit(self, job: _Job) -> None:
        self._unserved.append(job)
        if self.metrics is not None:
            self.metrics.queue_requests.labels(model=self.name).inc()
            self.metrics.queue_pairs.labels(model=self.name).inc(len(job.pairs))

    def _drop(self, job: _Job) -> None:
        if self.metrics is not None:
            self.metrics.queue_requests.labels(model=self.name).dec()
            self.metrics.queue_pairs.labels(model=self.name).dec(job.remaining)

    def _pending_pairs(self) -> int:
        return sum(job.remaining for job in (*self._unserved, *self._served))

    def _take(self, timeout: float | None) -> bool | None:
        """Admit the next queued job, waiting up to ``timeout`` (None: not at all): True if one was admitted,
        False if none came, None for the stop marker."""
        try:
            job = self._queue.get(timeout=timeout) if timeout is not None else self._queue.get_nowait()
        except queue.Empty:
            return False
        if job is None:
            return None
        self._admit(job)
        return True

    def _wait_for_work(self) -> bool:
        """Block until a job is waiting (then wait up to ``max_wait`` for company); False once stopped and idle."""
        stop = False
        if not self._unserved and not self._served:
            first = self._queue.get()
            if first is None:
                return False
            self._admit(first)
            deadline = time.perf_counter() + self.max_wait
            while self._pending_pairs() < self.max_batch_pairs:
                remaining = deadline - time.perf_counter()
                taken = self._take(remaining if remaining > 0 else None)
                if taken is not True:
                    stop = taken is None
                    break
        while not stop:  # whoever arrived while the last batch was scored joins this round
            taken = self._take(None)
            if taken is not True:
                stop = taken is None
                break
        if stop:
            self._stopping = True
        return True

    def _next_batch(self) -> list[tuple[_Job, int, int]]:
        """Slices ``(job, lo, hi)`` of at most ``max_batch_pairs`` pairs in all, from the jobs not served yet this
        round, else (a new round) from those served."""
        for jobs in (self._unserved, self._served):
            for job in [j for j in jobs if j.gone()]:
                jobs.remove(job)
                self._drop(job)
        if not self._unserved:  # a new round
            self._unserved, self._served = self._served, self._unserved
        if not self.ranker.pointwise:  # its scores depend on the list (a cascade): one request, whole, per call
            jobs = self._unserved if self._unserved else self._served
            if not jobs:
                return []
            job = jobs.popleft()
            batch, job.taken = [(job, job.taken, len(job.pairs))], len(job.pairs)
            return batch
        batch, budget = [], self.max_batch_pairs
        # requests not served yet this round go alone (with each other): a big one's next slice would only
        # make them wait for it; the served ones follow in the next batch
        for jobs in (self._unserved,) if self._unserved else (self._served,):
            for job in list(jobs):
                if budget == 0:
                    break
                take = min(job.remaining, budget)
                batch.append((job, job.taken, job.taken + take))
                job.taken += take
                budget -= take
                jobs.remove(job)
                if job.remaining:  # to the back of the served: the others go first next time
                    self._served.append(job)
        return batch

    def _run(self) -> None:
        self._stopping = False
        while self._wait_for_work():
            batch = self._next_batch()
            if not batch:
                if self._stopping and not self._unserved and not self._served:
                    return
                continue
            now = time.perf_counter()
            self.stats.record([hi - lo for _, lo, hi in batch])
            if self.metrics is not None:
                for job, lo, _ in batch:
                    if lo == 0:
                        self.metrics.queue_wait.labels(model=self.name).observe(now - job.queued_at)
            results = score_jobs(self.ranker, [job.pairs[lo:hi] for job, lo, hi in batch])
            if self.metrics is not None:
                n = sum(hi - lo for _, lo, hi in batch)
                self.metrics.batch_pairs.labels(model=self.name).observe(n)
                self.metrics.pairs_scored.labels(model=self.name).inc(n)
            for (job, lo, hi), result in zip(batch, results):
                if job.failed:
                    continue
                if self.metrics is not None:
                    self.metrics.queue_pairs.labels(model=self.name).dec(hi - lo)
                if isinstance(result, Exception):
                    job.failed = True
                    self._drop_failed(job)
                    _deliver(job, exc=result)
                    continue
                job.scores.append(result)
                if hi == len(job.pairs):
                    if self.metrics is not None:
                        self.metrics.queue_requests.labels(model=self.name).dec()
                    _deliver(job, result=np.concatenate(job.scores))
            if self._stopping and not self._unserved and not self._served:
                return

    def _drop_failed(self, job: _Job) -> None:
        for jobs in (self._unserved, self._served):
            if job in jobs:
                jobs.remove(job)
        if self.metrics is not None:
            self.metrics.queue_requests.labels(model=self.name).dec()
            self.metrics.queue_pairs.labels(model=self.name).dec(job.remaining)


def _deliver(job: _Job, result=None, exc: BaseException | None = None) -> None:
    def settle() -> None:
        if job.future.done():  # the client went away and the request was cancelled
            return
        if exc is not None:
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)

    try:
        job.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed (server shutting down)
        log.debug("dropped a result for a closed event loop")
