"""The FastAPI app: Cohere/Jina/TEI-compatible rerank, filter, health and model list.

Example::

    from ragsieve.serve import ServeConfig, create_app
    import uvicorn
    uvicorn.run(create_app(ServeConfig(reranker="bm25")), host="127.0.0.1", port=8080)

    # then, from any Cohere v2 client:
    # cohere.ClientV2(base_url="http://127.0.0.1:8080", api_key="-").rerank(
    #     model="ragsieve", query="who wrote hamlet", documents=["Paris", "Shakespeare wrote Hamlet"])
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from contextlib import asynccontextmanager
from typing import Union

import numpy as np
from fastapi import Body, FastAPI, Request

from ragsieve.errors import RagsieveError
from ragsieve.evolve.live import FeedbackItem
from ragsieve.pipeline.stages import SieveStages
from ragsieve.rerank.base import as_passages, ranked_from_scores
from ragsieve.serve.chunks import plan_chunks
from ragsieve.serve.config import ServeConfig
from ragsieve.serve.errors import ServeError, install_error_handlers, request_id
from ragsieve.serve.guard import Guard
from ragsieve.serve.models import ServedModels
from ragsieve.serve.schemas import (
    Document,
    AskRequest,
    AskResponse,
    Context,
    ErrorBody,
    GateRequest,
    GateResponse,
    FeedbackResponse,
    FilterRequest,
    FilterResponse,
    FilteredDocument,
    Health,
    Meta,
    ModelCard,
    ModelList,
    RerankRequest,
    RerankResponse,
    RerankResult,
    TEIRerankRequest,
    TEIRerankResult,
)

log = logging.getLogger("ragsieve.serve")

ERRORS = {
    400: {"model": ErrorBody, "description": "feature not configured"},
    401: {"model": ErrorBody, "description": "missing or wrong API key"},
    413: {"model": ErrorBody, "description": "over a configured limit (the error names the field)"},
    422: {"model": ErrorBody, "description": "malformed request (the error names the field)"},
    503: {"model": ErrorBody, "description": "the model was reloaded while the request queued; retry"},
}


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


INLINE_CHUNKING_CHARS = 200_000


class RerankCore:
    """Limits, chunking and batched scoring shared by every rerank-shaped route."""

    def __init__(self, config: ServeConfig, models: ServedModels):
        self.config = config
        self.models = models

    def check(self, query: str, docs: Sequence[str], field: str = "documents") -> tuple[str, list[str]]:
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

    async def scores(self, query: str, docs: list[str], meta: Meta) -> np.ndarray:
        """One score per document (best chunk for long ones); ``meta`` records the chunking."""
        models = self.models  # one snapshot: a reload mid-request does not mix models
        args = (models.ranker, query, docs, self.config.max_chunks_per_doc)
        # tokenising megabytes would stall every other request on the event loop; small requests stay inline
        big = sum(map(len, docs)) > INLINE_CHUNKING_CHARS
        plan = await asyncio.to_thread(plan_chunks, *args) if big else plan_chunks(*args)
        raw = await models.rank_batcher.score([(query, t) for t in plan.texts])
        meta.chunked_documents = plan.chunked
        meta.truncated_documents = plan.truncated
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


def _texts(documents: Sequence[Document]) -> list[str]:
    return [d if isinstance(d, str) else d.text for d in documents]


def create_app(config: ServeConfig, models: ServedModels | None = None) -> FastAPI:
    """The service for ``config`` (models load now, so a bad spec fails before the server binds)."""
    config = config.expanded()  # a sieve's stages become plain specs
    if config.feedback_store:  # a wrong store path fails at start-up, not at the first feedback
        from ragsieve.evolve.live import pending_feedback

        pending_feedback(config.feedback_store)
    models = models or ServedModels.load(config)
    core = RerankCore(config, models)
    name = config.model_name or config.reranker

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        core.models.close()

    app = FastAPI(
        title="ragsieve serve",
        version="1",
        lifespan=lifespan,
        description="LLM-aware rerank and filter service; Cohere/Jina/TEI-compatible rerank endpoints.",
    )
    app.state.core = core
    install_error_handlers(app)
    api_key = config.api_key.get_secret_value() if config.api_key else None
    app.add_middleware(Guard, api_key=api_key, max_body_bytes=config.max_body_bytes)

    async def cohere_rerank(body: RerankRequest, request: Request) -> RerankResponse:
        query, docs = core.check(body.query, _texts(body.documents))
        meta = Meta(request_id=request_id(request))
        scores = await core.scores(query, docs, meta)
        order = np.argsort(-scores, kind="stable")[: body.top_n or len(docs)]
        results = [
            RerankResult(
                index=int(i),
                relevance_score=float(scores[i]),
                document={"text": docs[i]} if body.return_documents else None,
            )
            for i in order
        ]
        return RerankResponse(
            id=str(uuid.uuid4()),
            model=name,
            results=results,
            meta=meta,
            usage={"total_tokens": 0, "documents": len(docs)},
        )

    async def cohere_rerank_route(request: Request, body: RerankRequest = Body(...)):
        return await cohere_rerank(body, request)

    # one handler, two paths: Cohere v1 / Jina and Cohere v2 share the request and response shape
    for path, shape in (("/v1/rerank", "Cohere v1 / Jina"), ("/v2/rerank", "Cohere v2")):
        app.add_api_route(
            path, cohere_rerank_route, methods=["POST"], response_model=RerankResponse,
            response_model_exclude_none=True, responses=ERRORS, tags=["rerank"],
            summary=f"Rerank documents ({shape} shape)", name=f"rerank_{path.split('/')[1]}",
        )

    @app.post(
        "/rerank",
        response_model=Union[RerankResponse, list[TEIRerankResult]],
        response_model_exclude_none=True,
        responses=ERRORS,
        tags=["rerank"],
        summary="Rerank: Cohere/Jina body, or a TEI body (query, texts)",
    )
    async def rerank_any(request: Request, body: TEIRerankRequest | RerankRequest = Body(...)):
        if isinstance(body, RerankRequest):
            return await cohere_rerank(body, request)
        query, docs = core.check(body.query, body.texts, field="texts")
        scores = await core.scores(query, docs, Meta())
        order = np.argsort(-scores, kind="stable")
        return [
            TEIRerankResult(index=int(i), score=float(scores[i]), text=docs[i] if body.return_text else None)
            for i in order
        ]

    @app.post(
        "/v1/filter",
        response_model=FilterResponse,
        response_model_exclude_none=True,
        responses=ERRORS,
        tags=["filter"],
        summary="The sieve: rerank, keep the top_n (default: the sieve's top_k), keep those graded relevant",
    )
    async def filter_docs(request: Request, body: FilterRequest = Body(...)):
        query, docs = core.check(body.query, _texts(body.documents))
        served = core.models
        threshold = body.threshold if body.threshold is not None else served.threshold
        if threshold is None:
            raise ServeError(400, "no grader configured (start with --grader, or pass 'threshold')")
        meta = Meta(request_id=request_id(request))
        # the one sieve (rerank → top_k → grade → keep); the request's top_n and threshold override the sieve's
        stages = SieveStages.from_config(config, served.ranker, served.grader).override(
            top_k=body.top_n, threshold=threshold
        )
        scores = await core.scores(query, docs, meta)
        result = stages.cut(ranked_from_scores(query, as_passages(docs), scores))
        if served.grade_batcher is not None:  # the grader's scores, batched with other requests'
            result = stages.decide(result, finite(await served.grade_batcher.score(stages.grade_pairs(result))))
        else:  # the ranker is its own grader: its scores against the threshold
            result = stages.grade(result)
        results = [
            FilteredDocument(
                index=r.index,
                relevance_score=r.score,
                relevant=True,
                grade_score=verdict.score,
                document={"text": docs[r.index]} if body.return_documents else None,
            )
            for r, verdict in result.kept_results
        ]
        return FilterResponse(
            id=str(uuid.uuid4()),
            model=name,
            grader=served.grader_name or name,
            threshold=float(threshold),
            results=results,
            dropped=len(docs) - len(results),
            meta=meta,
        )

    @app.post(
        "/v1/feedback",
        response_model=FeedbackResponse,
        responses=ERRORS,
        tags=["feedback"],
        summary="Append relevance feedback to the evolve store",
    )
    async def feedback(request: Request, body: Union[FeedbackItem, list[FeedbackItem]] = Body(...)):
        from ragsieve.evolve.live import append_feedback, pending_feedback

        if not config.feedback_store:
            raise ServeError(400, "no feedback store configured (start with --feedback-store)")
        items = body if isinstance(body, list) else [body]
        if len(items) > config.max_documents:
            raise ServeError(413, f"body: {len(items)} feedback items, max_documents is {config.max_documents}")
        for i, item in enumerate(items):
            texts = [t for t in (item.query, item.document, item.chosen, item.rejected) if t is not None]
            if any(len(t) > config.max_document_chars for t in texts):
                raise ServeError(413, f"{i}: a text is longer than max_document_chars ({config.max_document_chars})")
        # sqlite waits for other writers (WAL, busy timeout): never on the event loop
        try:
            stored = await asyncio.to_thread(append_feedback, config.feedback_store, items)
            pending = await asyncio.to_thread(pending_feedback, config.feedback_store)
        except RagsieveError as exc:  # the store, not the request, is at fault (damaged, unwritable)
            log.error("rid=%s feedback store: %s", request_id(request), exc)
            raise ServeError(503, f"feedback store unavailable: {str(exc).splitlines()[0]}") from None
        log.info("rid=%s feedback: %d row(s) from %s", request_id(request), stored, sorted({x.source for x in items}))
        return FeedbackResponse(stored=stored, pending=pending, request_id=request_id(request))

    def llm_stages():
        stages = core.models.llm
        if stages is None:
            raise ServeError(400, "no LLM configured (start with --llm, and --probe for the gate)")
        return stages

    @app.post(
        "/v1/gate",
        response_model=GateResponse,
        responses=ERRORS,
        tags=["rag"],
        summary="CBDR: Conf(Q) and whether to retrieve (Conf(Q) <= beta)",
    )
    async def gate(request: Request, body: GateRequest = Body(...)):
        query, _ = core.check(body.query, [])
        stages = llm_stages()
        if stages.gate_batcher is None:
            raise ServeError(400, "no probe configured (start with --probe)")
        conf = float(finite(await stages.gate_batcher.score([(query, "")]))[0])
        beta = body.beta if body.beta is not None else stages.beta
        return GateResponse(confidence=conf, retrieve=conf <= beta, beta=beta)

    @app.post(
        "/v1/ask",
        response_model=AskResponse,
        responses=ERRORS,
        tags=["rag"],
        summary="Answer with the whole pipeline: gate → retrieve → rerank → grade → generate",
    )
    async def ask(request: Request, body: AskRequest = Body(...)):
        query, _ = core.check(body.query, [])
        stages = llm_stages()
        result = await asyncio.to_thread(stages.answer, query)
        return AskResponse(
            answer=result.answer,
            retrieved=result.retrieved,
            confidence=result.confidence,
            contexts=[Context(id=p.id, text=p.text, title=p.title) for p in result.contexts],
            graded_out=result.graded_out,
            seconds=result.seconds,
        )

    @app.get("/health", response_model=Health, tags=["service"])
    async def health():
        stats = core.models.rank_batcher.stats
        return Health(status="ok", model=name, batches=stats.batches, pairs=stats.pairs)

    @app.get("/v1/models", response_model=ModelList, responses=ERRORS, tags=["service"])
    async def list_models():
        cards = [ModelCard(id=name, kind="reranker")]
        if core.models.grader_name:
            cards.append(ModelCard(id=core.models.grader_name, kind="grader"))
        return ModelList(data=cards)

    @app.post("/admin/reload", responses=ERRORS, tags=["service"], summary="Reload the models from their specs")
    async def reload():
        fresh = await asyncio.to_thread(ServedModels.load, config)
        old, core.models = core.models, fresh
        await asyncio.to_thread(old.close)
        return {"status": "reloaded", "model": name}

    return app
