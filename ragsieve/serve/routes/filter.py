"""``/v1/filter``: the sieve over the request's documents (rerank → top_n → grade → keep).

The same :class:`~ragsieve.pipeline.stages.SieveStages` the pipeline, ``Sieve.filter`` and the
adapters apply; only the model calls differ (chunked and batched with other requests).

Scores are on ``/v1/rerank``'s [0, 1] scale: ``relevance_score`` is the reranker's and ``grade_score``
the grader's :meth:`~ragsieve.rerank.base.BaseRanker.unit_scores`, and the request's ``threshold`` (in
[0, 1] too) becomes the grader's raw threshold through
:meth:`~ragsieve.rerank.base.BaseRanker.raw_threshold` before the stages use it, since the stages, the
pipeline and a sieve's ``sieve.json`` keep raw thresholds. ``raw_scores: true`` skips both mappings: raw
scores out, a raw threshold in (what ``/v1/filter`` answered before it spoke [0, 1]).
"""

from __future__ import annotations

import uuid

import numpy as np
from fastapi import APIRouter, Body, Depends, Request

from ragsieve.pipeline.stages import SieveStages
from ragsieve.rerank.base import as_passages, ranked_from_scores
from ragsieve.serve.errors import ServeError, request_id
from ragsieve.serve.models import ServedModels
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
    # one set of models for the whole request: a reload meanwhile cannot rank with one and grade with another
    async with state.snapshot() as served:
        return await _filter(request, body, state, served, query, docs)


async def _filter(request: Request, body: FilterRequest, state: ServeState, served: ServedModels, query: str,
                  docs: list[str]) -> FilterResponse:
    # whose scores the threshold cuts: the grader's, else the ranker is its own grader
    grader = served.grader if served.grader is not None else served.ranker
    if body.threshold is None:
        threshold = served.threshold  # the sieve's / grader's, raw
        if threshold is None:
            raise ServeError(400, "no grader configured (start with --grader, or pass 'threshold')")
        shown = threshold if body.raw_scores else float(grader.unit_scores([threshold])[0])
    else:
        threshold = body.threshold if body.raw_scores else grader.raw_threshold(body.threshold)
        shown = body.threshold  # as the client sent it, not a round trip through the inverse
    meta = Meta(request_id=request_id(request))
    # the request's top_n and threshold override the sieve's
    stages = SieveStages.from_config(state.config, served.ranker, served.grader).override(
        top_k=body.top_n, threshold=threshold
    )
    scores = await state.scores(served, query, docs, meta)
    result = stages.cut(ranked_from_scores(query, as_passages(docs), scores))
    if served.grade_batcher is not None:  # the grader's scores, batched with other requests'
        result = stages.decide(result, finite(await served.grade_batcher.score(stages.grade_pairs(result))))
    else:  # the ranker is its own grader: its scores against the threshold
        result = stages.grade(result)
    kept = result.kept_results
    rank_raw = np.array([r.score for r, _ in kept], dtype=float)
    grade_raw = np.array([verdict.score for _, verdict in kept], dtype=float)
    if body.raw_scores:
        rank_shown, grade_shown = rank_raw, grade_raw
    else:  # the [0, 1] scores /v1/rerank answers, and the threshold's scale
        rank_shown, grade_shown = served.ranker.unit_scores(rank_raw), grader.unit_scores(grade_raw)
    results = [
        FilteredDocument(
            index=r.index,
            relevance_score=float(rank_score),
            relevant=True,
            grade_score=float(grade_score),
            document={"text": docs[r.index]} if body.return_documents else None,
        )
        for (r, _), rank_score, grade_score in zip(kept, rank_shown, grade_shown)
    ]
    return FilterResponse(
        id=str(uuid.uuid4()),
        model=state.name,
        grader=served.grader_name or state.name,
        threshold=float(shown),
        raw_scores=body.raw_scores,
        results=results,
        dropped=len(docs) - len(results),
        meta=meta,
    )
