"""The FastAPI app: the endpoint routers of :mod:`ragsieve.serve.routes` around one shared state.

Example::

    from ragsieve.serve import ServeConfig, create_app
    import uvicorn
    uvicorn.run(create_app(ServeConfig(reranker="bm25")), host="127.0.0.1", port=8080)

    # then, from any Cohere v2 client:
    # cohere.ClientV2(base_url="http://127.0.0.1:8080", api_key="-").rerank(
    #     model="ragsieve", query="who wrote hamlet", documents=["Paris", "Shakespeare wrote Hamlet"])
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from ragsieve.serve.config import ServeConfig
from ragsieve.serve.errors import install_error_handlers
from ragsieve.serve.guard import Guard
from ragsieve.serve.models import ServedModels
from ragsieve.serve.routes.admin import router as admin_router
from ragsieve.serve.routes.feedback import router as feedback_router
from ragsieve.serve.routes.filter import router as filter_router
from ragsieve.serve.routes.rag import router as rag_router
from ragsieve.serve.routes.rerank import router as rerank_router
from ragsieve.serve.state import ServeState

#: every endpoint family, in the order /openapi.json lists them
ROUTERS = (rerank_router, filter_router, feedback_router, rag_router, admin_router)


def _route_paths() -> frozenset[str]:
    """Every endpoint's path (the metric labels), read from the routers themselves."""
    return frozenset(route.path for router in ROUTERS for route in router.routes if hasattr(route, "path"))


def create_app(
    config: ServeConfig, models: ServedModels | None = None, *, state: ServeState | None = None,
    echo_request_id: bool = True,
) -> FastAPI:
    """The service for ``config`` (models load now, so a bad spec fails before the server binds).

    ``state``: one already loaded (Ray Serve's replicas load theirs with their own batcher);
    ``echo_request_id=False`` behind a proxy that sets ``x-request-id`` on responses itself.
    """
    state = state or ServeState.load(config, models)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        state.close()

    app = FastAPI(
        title="ragsieve serve",
        version="1",
        lifespan=lifespan,
        description="LLM-aware rerank and filter service; Cohere/Jina/TEI-compatible rerank endpoints.",
    )
    app.state.serve = state
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    api_key = state.config.api_key.get_secret_value() if state.config.api_key else None
    app.add_middleware(
        Guard, api_key=api_key, max_body_bytes=state.config.max_body_bytes, echo_request_id=echo_request_id,
        replica=state.replica, metrics=state.metrics, routes=_route_paths(), stopping=lambda: state.stopping,
    )
    return app
