"""The service itself: ``/health`` (liveness), ``/ready`` (readiness), ``/metrics`` (Prometheus), ``/v1/models``
and ``/admin/reload`` (the models, swapped whole; on Ray Serve on every replica)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response

from ragsieve.serve.schemas import Health, ModelCard, ModelList
from ragsieve.serve.state import ERRORS, ServeState, serve_state

router = APIRouter(tags=["service"])


@router.get("/health", response_model=Health, response_model_exclude_none=True)
async def health(state: ServeState = Depends(serve_state)):
    stats = state.models.rank_batcher.stats
    return Health(status="ok", model=state.name, batches=stats.batches, pairs=stats.pairs, replica=state.replica)


@router.get("/ready", summary="Readiness: 200 once the models are loaded, 503 while shutting down")
async def ready(state: ServeState = Depends(serve_state)):
    body = {"status": "ready" if state.ready else "shutting down", "model": state.name,
            "version": state.metrics.version}
    return JSONResponse(body, status_code=200 if state.ready else 503)


@router.get("/metrics", summary="Prometheus metrics (text format): requests, latency, queue, batches, rows")
async def metrics(state: ServeState = Depends(serve_state)):
    from ragsieve.serve.metrics import CONTENT_TYPE

    return Response(state.metrics.exposition(), media_type=CONTENT_TYPE)


@router.get("/v1/models", response_model=ModelList, responses=ERRORS)
async def list_models(state: ServeState = Depends(serve_state)):
    cards = [ModelCard(id=state.name, kind="reranker")]
    if state.models.grader_name:
        cards.append(ModelCard(id=state.models.grader_name, kind="grader"))
    return ModelList(data=cards)


@router.post("/admin/reload", responses=ERRORS, summary="Reload the models from their specs")
async def reload(state: ServeState = Depends(serve_state)):
    if state.reload_everywhere is not None:  # Ray Serve: every replica, not only the one this request reached
        replicas = await state.reload_everywhere()
        return {"status": "reloaded", "model": state.name, "replicas": replicas}
    await state.reload()
    return {"status": "reloaded", "model": state.name}
