"""``/v1/filter``: the sieve over the request's documents (rerank → top_n → grade → keep).

The same :class:`~ragsieve.pipeline.stages.SieveStages` the pipeline, ``Sieve.filter`` and the
adapters apply; only the model calls differ (chunked and batched with other requests).
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Body, Depends, Request

from ragsieve.pipeline.stages import SieveStages
from ragsieve.rerank.base import as_passages, ranked_from_scores
from ragsieve.serve.errors import ServeError, request_id
from ragsieve.serve.schemas import FilteredDocument, FilterRequest, FilterResponse, Meta
from ragsieve.serve.state import ERRORS, ServeState, finite, serve_state, texts

router = APIRouter(tags=["filter"])


@router.post(
    "/v1/filter",
    response_model=FilterResponse,
    response_model_exclude_none=True,
    responses=ERRORS,
    summary="The sieve: rerank, keep the top_n (default: the sieve's top_k), keep those graded relevant",
)
async def filter_docs(request: Request, body: FilterRequest = Body(...), state: ServeState = Depends(serve_state)):
    query, docs = state.check(body.query, texts(body.documents))
    served = state.models
    threshold = body.threshold if body.threshold is not None else served.threshold
    if threshold is None:
        raise ServeError(400, "no grader configured (start with --grader, or pass 'threshold')")
    meta = Meta(request_id=request_id(request))
    # the request's top_n and threshold override the sieve's
    stages = SieveStages.from_config(state.config, served.ranker, served.grader).override(
        top_k=body.top_n, threshold=threshold
    )
    scores = await state.scores(query, docs, meta)
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
        model=state.name,
        grader=served.grader_name or state.name,
        threshold=float(threshold),
        results=results,
        dropped=len(docs) - len(results),
        meta=meta,
    )
