"""What every endpoint family shares: the served models behind limits, chunking and batching.

:func:`create_app <ragsieve.serve.app.create_app>` puts one :class:`ServeState` on
``app.state.serve``; each router in :mod:`ragsieve.serve.routes` reads it through the
:func:`serve_state` dependency, so a router also works mounted alone on an app holding a state.

Example::

    app = FastAPI()
    app.state.serve = ServeState.load(ServeConfig(reranker="bm25"))
    app.include_router(filter_router)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from fastapi import Request

from ragsieve.rerank.chunks import plan_chunks, window_reader
from ragsieve.serve.config import ServeConfig
from ragsieve.serve.errors import ServeError
from ragsieve.serve.metrics import ServeMetrics
from ragsieve.serve.batcher import PairBatcher
from ragsieve.serve.models import BatcherFactory, ServedModels
from ragsieve.serve.schemas import Document, ErrorBody, Meta

if TYPE_CHECKING:
    from ragsieve.evolve.live import TrafficLog

#: the error responses every endpoint documents in /openapi.json
ERRORS = {
    400: {"model": ErrorBody, "description": "feature not configured"},
    401: {"model": ErrorBody, "description": "missing or wrong API key"},
    413: {"model": ErrorBody, "description": "over a configured limit (the error names the field)"},
    422: {"model": ErrorBody, "description": "malformed request (the error names the field)"},
    503: {"model": ErrorBody, "description": "the model was reloaded under the request; retry"},
}

#: how long a reload lets requests that hold the old models finish on them before it closes them
RELOAD_DRAIN_S = 120.0


def clean_text(text: str) -> str:
    """Lone surrogates (legal in JSON, not in UTF-8) would break tokenizers and the response encoder."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def finite(scores: np.ndarray) -> np.ndarray:
    """JSON has no NaN or infinity: clamp them just outside the finite scores' range."""
    scores = np.asarray(scores, dtype=float)
    ok = np.isfinite(scores)
    if ok.all():
        return scores
    lo, hi = (scores[ok].min(), scores[ok].max()) if ok.any() else (0.0, 0.0)
    return np.where(np.isnan(scores) | np.isneginf(scores), lo - 1.0, np.where(np.isposinf(scores), hi + 1.0, scores))


def texts(documents: Sequence[Document]) -> list[str]:
    return [d if isinstance(d, str) else d.text for d in documents]


@dataclass
class ServeState:
    """The config (a sieve already expanded into plain specs), the served models (swapped whole on
    reload) and the model id clients see."""

    config: ServeConfig
    models: ServedModels
    name: str
    traffic: "TrafficLog | None" = None  # --log-traffic: served pairs → the evolve store, off the request path
    batcher: BatcherFactory = PairBatcher  # how each model's calls are batched (reloads make the same kind)
    replica: str | None = None  # on Ray Serve: which replica this is (/health says who answered)
    # on Ray Serve: /admin/reload reloads every replica through this (returns how many serve the new models)
    reload_everywhere: Callable[[], Awaitable[int]] | None = None
    metrics: ServeMetrics = field(default_factory=lambda: ServeMetrics("model"))  # what /metrics answers
    ready: bool = True  # /ready: the models are loaded (False from SIGTERM on: the drain, then the shutdown)
    stopping: bool = False  # the drain is over: a request still arriving is refused (503 + Retry-After)

    @classmethod
    def load(
        cls, config: ServeConfig, models: ServedModels | None = None, batcher: BatcherFactory = PairBatcher
    ) -> "ServeState":
        """Models load now, so a bad spec fails before the server binds."""
        config = config.expanded()  # a sieve's stages become plain specs
        if config.feedback_store:  # a wrong store path fails at start-up, not at the first feedback
            from ragsieve.evolve.live import pending_feedback

            pending_feedback(config.feedback_store)
        name = config.model_name or config.reranker
        metrics = ServeMetrics(name)
        models = models or ServedModels.load(config, batcher, metrics)
        from ragsieve.evolve.live import traffic_log

        traffic = traffic_log(config.feedback_store, config.log_traffic)
        if traffic is not None:
            metrics.traffic_counts = lambda: (traffic.written, traffic.dropped)
        state = cls(config, models, name, traffic, batcher, metrics=metrics)
        metrics.embedding_cache = lambda: embedding_cache_meta(state.models.ranker)  # the models a reload swaps in
        return state

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[ServedModels]:
        """The served models for one request, whole: a reload meanwhile gives later requests the new
        ones, and closes these only once every request holding them is done (within ``RELOAD_DRAIN_S``),
        so a request never scores with one reranker and grades with another.

        Example::

            async with state.snapshot() as models:
                raw = await state.scores(models, query, docs, meta)
        """
        models = self.models
        models.users += 1  # on the event loop, like the reload that reads it: no lock needed
        try:
            yield models
        finally:
            models.users -= 1
            if not models.users and models.released is not None:
                models.released.set()

    async def reload(self) -> None:
        """Fresh models from the config's specs, swapped whole; the old ones finish the requests that
        hold them (:meth:`snapshot`), then close."""
        fresh = await asyncio.to_thread(ServedModels.load, self.config, self.batcher, self.metrics)
        old, self.models = self.models, fresh
        self.metrics.reloads.inc()
        self.metrics.served(self.name)
        if old.users:
            old.released = asyncio.Event()
            with suppress(TimeoutError):
                await asyncio.wait_for(old.released.wait(), RELOAD_DRAIN_S)
        await asyncio.to_thread(old.close)  # a request still holding them after that gets a 503: retry

    def drain(self) -> None:
        """SIGTERM: ``/ready`` answers 503 from now on, while requests are still answered."""
        self.ready = False

    def stop(self) -> None:
        """The drain is over: requests already in flight finish, new ones are refused."""
        self.ready = False
        self.stopping = True

    def close(self) -> None:
        """At shutdown: the traffic still queued is written, then the models are released."""
        self.ready = False
        if self.traffic is not None:
            self.traffic.close()
        self.models.close()

    def check(self, query: str, docs: Sequence[str], field: str = "documents") -> tuple[str, list[str]]:
        """The request within the configured limits (413/422 naming the field), its text made UTF-8 safe."""
        cfg = self.config
        if not query.strip():
            raise ServeError(422, "query: must not be empty")
        if len(query) > cfg.max_query_chars:
            raise ServeError(413, f"query: {len(query)} characters, max_query_chars is {cfg.max_query_chars}")
        if len(docs) > cfg.max_documents:
            raise ServeError(413, f"{field}: {len(docs)} documents, max_documents is {cfg.max_documents}")
        for i, d in enumerate(docs):
            if len(d) > cfg.max_document_chars:
                raise ServeError(
                    413, f"{field}.{i}: {len(d)} characters, max_document_chars is {cfg.max_document_chars}"
                )
        return clean_text(query), [clean_text(d) for d in docs]

    async def rerank_scores(self, query: str, docs: list[str], meta: Meta) -> tuple[np.ndarray, np.ndarray]:
        """(logits, the [0, 1] scores clients threshold), from one model snapshot: the ranker's
        :meth:`~ragsieve.rerank.base.BaseRanker.logit_scores` and
        :meth:`~ragsieve.rerank.base.BaseRanker.unit_scores` of its raw scores (both in the raw order)."""
        async with self.snapshot() as models:
            raw = await self.scores(models, query, docs, meta)
            if not len(raw):
                return np.zeros(0), np.zeros(0)
            return models.ranker.logit_scores(raw), models.ranker.unit_scores(raw)

    async def scores(self, models: ServedModels, query: str, docs: list[str], meta: Meta) -> np.ndarray:
        """One raw score per document from ``models``' ranker, the request's :meth:`snapshot` (best chunk
        for long documents); ``meta`` records the chunking."""
        args = (window_reader(models.ranker), query, docs, self.config.max_chunks_per_doc)
        # off the event loop, whatever the size: the loop goes on reading other requests (and /ready) meanwhile
        plan = await asyncio.to_thread(plan_chunks, *args)
        if len(plan.texts) > self.config.max_pairs_per_request:
            raise ServeError(413, f"documents: {len(plan.texts)} pairs to score ({len(plan.chunked)} document(s) "
                             f"split into model windows), max_pairs_per_request is "
                             f"{self.config.max_pairs_per_request}")
        if self.traffic is not None:
            self.traffic.record(query, docs)  # a queue put: the write happens off the request path
        self.metrics.chunked_documents.inc(len(plan.chunked))
        self.metrics.truncated_documents.inc(len(plan.truncated))
        raw = await models.rank_batcher.score([(query, t) for t in plan.texts])
        meta.chunked_documents = plan.chunked
        meta.truncated_documents = plan.truncated
        meta.embedding_cache = embedding_cache_meta(models.ranker)
        if plan.chunked:
            meta.warnings.append(
                f"{len(plan.chunked)} document(s) longer than the model window were split into chunks "
                "and scored by their best chunk"
            )
        if plan.truncated:
            meta.warnings.append(
                f"{len(plan.truncated)} document(s) exceeded max_chunks_per_doc="
                f"{self.config.max_chunks_per_doc}: their tail was not scored"
            )
        return finite(plan.reduce(raw)) if docs else np.zeros(0)


def embedding_cache_meta(ranker) -> dict | None:
    """What a response's ``meta.embedding_cache`` says: the process's passage-vector counts so far."""
    from ragsieve.rerank.vectors import vector_stats

    stats = vector_stats(ranker)
    if stats is None:
        return None
    return {"hits": stats["cache_hits"], "misses": stats["cache_misses"], "hit_ratio": stats["cache_hit_ratio"],
            "entries": stats["cache_entries"], "bytes": stats["cache_bytes"], "stored": stats["stored"]}


def serve_state(request: Request) -> ServeState:
    """The dependency every route reads the shared state through."""
    return request.app.state.serve
