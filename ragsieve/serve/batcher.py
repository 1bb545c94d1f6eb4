"""Dynamic batching: concurrent requests share one ``score_pairs`` call on a worker thread.

The event loop never runs the model. Each request's (query, text) pairs go into a queue;
the worker takes the first waiting job, waits at most ``max_wait_ms`` for more, up to
``max_batch_pairs`` pairs in all, scores them in one call and hands each request its
slice. A model error in a shared batch is retried per job, so one bad request cannot
fail the others it was batched with.

Example::

    batcher = PairBatcher(load_reranker("bm25"), max_wait_ms=5, max_batch_pairs=256)
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ragsieve.rerank.base import BaseRanker

log = logging.getLogger(__name__)


@dataclass
class _Job:
    pairs: Sequence[tuple[str, str]]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    queued_at: float = field(default_factory=time.perf_counter)


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
        self, ranker: BaseRanker, *, max_wait_ms: float = 5.0, max_batch_pairs: int = 256, name: str = "model"
    ):
        self.ranker = ranker
        self.max_wait = max_wait_ms / 1000.0
        self.max_batch_pairs = max_batch_pairs
        self.stats = BatchStats()
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
    def _collect(self, first: _Job) -> tuple[list[_Job], bool]:
        jobs, total, stop = [first], len(first.pairs), False
        deadline = time.perf_counter() + self.max_wait
        while total < self.max_batch_pairs:
            remaining = deadline - time.perf_counter()
            try:
                job = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                stop = True
                break
            jobs.append(job)
            total += len(job.pairs)
        return jobs, stop

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs, stop = self._collect(first)
            self.stats.record([len(job.pairs) for job in jobs])
            for job, result in zip(jobs, score_jobs(self.ranker, [job.pairs for job in jobs])):
                if isinstance(result, Exception):
                    _deliver(job, exc=result)
                else:
                    _deliver(job, result=result)
            if stop:
                return


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
