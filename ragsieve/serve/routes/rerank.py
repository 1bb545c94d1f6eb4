"""Rerank: one handler for the Cohere v1 / Jina and Cohere v2 paths, and TEI's ``/rerank``.

Scores are in [0, 1] as those clients expect (Open WebUI's and Dify's relevance thresholds are set on
that scale): the ranker's calibrated probability when it has a calibration (the shipped rerankers do),
see :meth:`~ragsieve.rerank.base.BaseRanker.unit_scores` for the others. TEI's ``raw_scores: true``
returns the logit instead (a sigmoid-output ranker's is mapped back; BM25 & co. answer their raw score).
"""

from __future__ import annotations

import uuid
from typing import Union

import numpy as np
from fastapi import APIRouter, Body, Depends, Request

from ragsieve.serve.errors import request_id
from ragsieve.serve.schemas import (
    Meta,
    RerankRequest,
    RerankResponse,
    RerankResult,
    TEIRerankRequest,
    TEIRerankResult,
)
from ragsieve.serve.state import ERRORS, ServeState, serve_state, texts

router = APIRouter(tags=["rerank"])


async def cohere_rerank(body: RerankRequest, request: Request, state: ServeState) -> RerankResponse:
    query, docs = state.check(body.query, texts(body.documents))
    meta = Meta(request_id=request_id(request))
    raw, unit = await state.rerank_scores(query, docs, meta)
    # ordered by the logit: the [0, 1] mapping keeps the order but may tie near 0 or 1
    order = np.argsort(-raw, kind="stable")[: body.top_n or len(docs)]
    results = [
        RerankResult(
            index=int(i),
            relevance_score=float(unit[i]),
            document={"text": docs[i]} if body.return_documents else None,
        )
        for i in order
    ]
    return RerankResponse(
        id=str(uuid.uuid4()),
        model=state.name,
        results=results,
        meta=meta,
        usage={"total_tokens": 0, "documents": len(docs)},
    )


async def cohere_rerank_route(
    request: Request, body: RerankRequest = Body(...), state: ServeState = Depends(serve_state)
):
    return await cohere_rerank(body, request, state)


# one handler, two paths: Cohere v1 / Jina and Cohere v2 share the request and response shape
for path, shape in (("/v1/rerank", "Cohere v1 / Jina"), ("/v2/rerank", "Cohere v2")):
    router.add_api_route(
        path, cohere_rerank_route, methods=["POST"], response_model=RerankResponse,
        response_model_exclude_none=True, responses=ERRORS,
        summary=f"Rerank documents ({shape} shape)", name=f"rerank_{path.split('/')[1]}",
    )


@router.post(
    "/rerank",
    response_model=Union[RerankResponse, list[TEIRerankResult]],
    response_model_exclude_none=True,
    responses=ERRORS,
    summary="Rerank: Cohere/Jina body, or a TEI body (query, texts)",
)
async def rerank_any(
    request: Request, body: TEIRerankRequest | RerankRequest = Body(...), state: ServeState = Depends(serve_state)
):
    if isinstance(body, RerankRequest):
        return await cohere_rerank(body, request, state)
    query, docs = state.check(body.query, body.texts, field="texts")
    raw, unit = await state.rerank_scores(query, docs, Meta())
    scores = raw if body.raw_scores else unit
    order = np.argsort(-raw, kind="stable")
    return [
        TEIRerankResult(index=int(i), score=float(scores[i]), text=docs[i] if body.return_text else None)
        for i in order
    ]
