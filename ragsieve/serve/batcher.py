"""Dynamic batching: concurrent requests share one ``score_pairs`` call on a worker thread.

The event loop never runs the model. Each request's (query, text) pairs go into a queue; when the
worker is idle it waits at most ``max_wait_ms`` for company. A pair costs its padded token width,
and a model call holds pairs of ONE padded width (:data:`~ragsieve.models.onnx.PAD_BUCKET`): the model
runs one width per forward pass anyway (batch-invariant scores), so the worker fills each pass from
every waiting request, as a long offline call would. Each request gives a call at most
``max_slice_tokens`` of its pairs, and a call holds at most ``max_batch_tokens`` (and
``max_batch_pairs`` pairs) in all. Which width comes next is decided by the request with the fewest
tokens left (then the oldest): a short request is admitted into the very next call, beside the
same-width pairs of the others, and waits for at most the call being scored, which a lone big request
keeps to one slice (TEI's token budget, vLLM's step-level admission). A model error in a shared call is
retried per request, so one bad request cannot fail the others it was batched with.

Example::

    batcher = PairBatcher(load_reranker("bm25"), max_wait_ms=5, max_batch_tokens=16384, max_slice_tokens=2048)
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
    # per pair, set on admission: the padded width a model call groups it by, and its tokens (PairWidths)
    widths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    costs: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    pending: list[int] = field(default_factory=list)  # pairs not handed to the model yet
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0))
    unscored: int = 0
    failed: bool = False

    @property
    def remaining(self) -> int:
        return len(self.pending)

    @property
    def started(self) -> bool:
        return len(self.pending) < len(self.pairs)

    def tokens_left(self) -> int:
        return int(self.costs[self.pending].sum()) if self.pending else 0

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
        self, ranker: BaseRanker, *, max_wait_ms: float = 5.0, max_batch_tokens: int = 16384,
        max_slice_tokens: int = 2048, max_batch_pairs: int = 512, name: str = "model",
        metrics: "ServeMetrics | None" = None,
    ):
        self.ranker = ranker
        self.max_wait = max_wait_ms / 1000.0
        self.max_batch_tokens = max_batch_tokens
        self.max_slice_tokens = max_slice_tokens
        self.max_batch_pairs = max_batch_pairs
        self.stats = BatchStats()
        self.name = name
        self.metrics = metrics
        self._jobs: list[_Job] = []  # admitted, in arrival order (worker thread only)
        self._widths = PairWidths(ranker)
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
        job.widths, job.costs = self._widths(job.pairs)  # tokenised here, on the worker: never on the event loop
        job.pending = sorted(range(len(job.pairs)), key=lambda i: job.widths[i])
        job.scores = np.zeros(len(job.pairs))
        job.unscored = len(job.pairs)
        self._jobs.append(job)
        if self.metrics is not None:
            self.metrics.queue_requests.labels(model=self.name).inc()
            self.metrics.queue_pairs.labels(model=self.name).inc(len(job.pairs))

    def _drop(self, job: _Job) -> None:
        self._jobs.remove(job)
        if self.metrics is not None:
            self.metrics.queue_requests.labels(model=self.name).dec()
            self.metrics.queue_pairs.labels(model=self.name).dec(job.unscored)

    def _pending_tokens(self) -> int:
        return sum(job.tokens_left() for job in self._jobs)

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
        if not any(job.pending for job in self._jobs):
            first = self._queue.get()
            if first is None:
                return False
            self._admit(first)
            deadline = time.perf_counter() + self.max_wait
            while self._pending_tokens() < self.max_batch_tokens:
                remaining = deadline - time.perf_counter()
                taken = self._take(remaining if remaining > 0 else None)
                if taken is not True:
                    stop = taken is None
                    break
        while not stop:  # whoever arrived while the last batch was scored is admitted before the next call
            taken = self._take(None)
            if taken is not True:
                stop = taken is None
                break
        if stop:
            self._stopping = True
        return True

    def _next_batch(self) -> list[tuple[_Job, list[int]]]:
        """The next call's pairs per job: one padded width, chosen by the job with the fewest tokens left; every
        job (that one first) gives its pairs of that width, at most ``max_slice_tokens`` of them, up to
        ``max_batch_tokens`` and ``max_batch_pairs`` in all."""
        for job in [j for j in self._jobs if j.gone()]:
            self._drop(job)
        waiting = sorted((j for j in self._jobs if j.pending), key=lambda j: (j.tokens_left(), j.queued_at))
        if not waiting:
            return []
        if not self.ranker.pointwise:  # its scores depend on the list (a cascade): one request, whole, per call
            job = min(waiting, key=lambda j: j.queued_at)
            batch, job.pending = [(job, job.pending)], []
            return batch
        width = waiting[0].widths[waiting[0].pending[0]]
        tokens, pairs, batch = self.max_batch_tokens, self.max_batch_pairs, []
        for job in waiting:
            take, budget = [], min(tokens, self.max_slice_tokens)
            for i in job.pending:
                if job.widths[i] != width:
                    continue
                if pairs <= 0 or job.costs[i] > budget:
                    if batch or take:  # a call holds at least one pair, however wide
                        break
                take.append(i)
                pairs -= 1
                budget -= int(job.costs[i])
                tokens -= int(job.costs[i])
            if take:
                batch.append((job, take))
                taken = set(take)
                job.pending = [i for i in job.pending if i not in taken]
            if pairs <= 0 or tokens <= 0:
                break
        return batch

    def _run(self) -> None:
        self._stopping = False
        while self._wait_for_work():
            batch = self._next_batch()
            if batch:
                self._score(batch)
            if self._stopping and not any(job.pending for job in self._jobs):
                return

    def _score(self, batch: list[tuple[_Job, list[int]]]) -> None:
        """One model call over ``batch``; each job whose last pair it scored is answered."""
        now = time.perf_counter()
        self.stats.record([len(idx) for _, idx in batch])
        if self.metrics is not None:
            for job, idx in batch:
                if len(job.pending) + len(idx) == len(job.pairs):  # its first call: how long it queued
                    self.metrics.queue_wait.labels(model=self.name).observe(now - job.queued_at)
        results = score_jobs(self.ranker, [[job.pairs[i] for i in idx] for job, idx in batch])
        if self.metrics is not None:
            n = sum(len(idx) for _, idx in batch)
            self.metrics.batch_pairs.labels(model=self.name).observe(n)
            self.metrics.pairs_scored.labels(model=self.name).inc(n)
        for (job, idx), result in zip(batch, results):
            if job.failed:
                continue
            if isinstance(result, Exception):
                job.failed = True
                self._drop(job)
                _deliver(job, exc=result)
                continue
            job.scores[idx] = result
            job.unscored -= len(idx)
            if self.metrics is not None:
                self.metrics.queue_pairs.labels(model=self.name).dec(len(idx))
            if not job.unscored:
                self._jobs.remove(job)
                if self.metrics is not None:
                    self.metrics.queue_requests.labels(model=self.name).dec()
                _deliver(job, result=job.scores)


class PairWidths:
    """What a pair costs a model call and which call it may join: its token count (the ranker's own tokenizer,
    capped at its window) rounded up to the padded width the model batches by, both; a ranker without a window
    (BM25, an LLM grader) is not batched by width: every pair joins any call, costing its characters / 4."""

    def __init__(self, ranker: BaseRanker):
        from ragsieve.models.onnx import PAD_BUCKET

        window = ranker.window() if hasattr(ranker, "window") else None
        self.tokenizer, self.limit = window if window is not None else (None, 0)
        self.bucket = PAD_BUCKET
        if self.tokenizer is not None:  # its first call sets its options: here, before any other thread uses it
            self.tokenizer(["warm"], ["up"], verbose=False)

    def __call__(self, pairs: Sequence[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray]:
        """(each pair's width, its cost in tokens)."""
        if self.tokenizer is None:
            costs = np.array([max((len(q) + len(t)) // 4, 1) for q, t in pairs], dtype=np.int64)
            return np.zeros(len(pairs), dtype=np.int64), costs
        # called as plan_chunks calls it (no truncation): the shared tokenizer's settings never change under it
        ids = self.tokenizer([q for q, _ in pairs], [t for _, t in pairs], verbose=False)["input_ids"]
        widths = -(-np.minimum([len(row) for row in ids], self.limit) // self.bucket) * self.bucket
        return widths.astype(np.int64), widths.astype(np.int64)


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
