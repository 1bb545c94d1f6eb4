"""``/v1/filter``: the sieve over the request's documents (rerank → top_n → grade → keep → prune).

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

import asyncio
import uuid
from dataclasses import replace

import numpy as np
from fastapi import APIRouter, Body, Depends, Request

from ragsieve.pipeline.stages import ModelCall, SieveStages
from ragsieve.prune import PrunedPassage, SentencePruner
from ragsieve.serve.errors import ServeError, request_id
from ragsieve.serve.models import ServedModels
from ragsieve.serve.schemas import FilteredDocument, FilterRequest, FilterResponse, Meta, PrunedOut
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
        if threshold is None and not state.config.keep_ungraded:
            raise ServeError(400, "no grader configured (start with --grader, or pass 'threshold')")
        shown = threshold if body.raw_scores or threshold is None else float(grader.unit_scores([threshold])[0])
    else:
        threshold = body.threshold if body.raw_scores else grader.raw_threshold(body.threshold)
        shown = body.threshold  # as the client sent it, not a round trip through the inverse
    meta = Meta(request_id=request_id(request))
    # the request's top_n, threshold and pruning override the sieve's; the sieve itself is SieveStages', its
    # model calls answered by the server's chunked, batched ones
    stages = SieveStages.from_config(state.config, served.ranker, served.grader, pruner_scorer=served.pruner)
    stages = stages.override(top_k=body.top_n, threshold=threshold)
    stages = replace(stages, pruner=_request_pruner(body, served, stages))
    result = await stages.apply_async(query, docs, lambda call: _scores(call, state, served, stages, docs, meta))
    items = result.kept_items  # what reaches the prompt, with its pruned text (None: whole)
    kept = [(r, verdict) for r, verdict, _ in items]
    pruned = {r.index: p for r, _, p in items if p is not None}
    rank_raw = np.array([r.score for r, _ in kept], dtype=float)
    # ungraded (a sieve without a grader): the ranker's score is the grade score, as for a self-grading ranker
    grade_raw = np.array([verdict.score if verdict is not None else r.score for r, verdict in kept], dtype=float)
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
            pruned=_pruned_out(pruned[r.index]) if r.index in pruned else None,
        )
        for (r, _), rank_score, grade_score in zip(kept, rank_shown, grade_shown)
    ]
    return FilterResponse(
        id=str(uuid.uuid4()),
        model=state.name,
        grader=served.grader_name or state.name,
        threshold=None if shown is None else float(shown),
        raw_scores=body.raw_scores,
        results=results,
        dropped=len(docs) - len(results),
        prune_threshold=_shown_prune_threshold(result.prune_threshold, body.raw_scores, stages),
        prune_rule=dict(result.prune_rule) if result.pruned else None,
        meta=meta,
    )


async def _scores(call: ModelCall, state: ServeState, served: ServedModels, stages: SieveStages, docs: list[str],
                  meta: Meta) -> np.ndarray:
    """A model call of the sieve, answered as the server answers every request: batched with other requests'
    pairs (and the documents chunked to the model window, as /v1/rerank reads them)."""
    if call.step == "rank":
        return await state.scores(served, call.query, docs, meta)
    if call.step == "grade":
        return finite(await served.grade_batcher.score([(call.query, p.text) for p in call.passages]))
    if stages.pruner.scorer is served.ranker:  # sentences are short: no chunking, and not traffic of their own
        return finite(np.asarray(await served.rank_batcher.score([(call.query, t) for t in call.layout.texts]), float))
    if stages.pruner.scorer is served.pruner and served.prune_batcher is not None:  # the served keep head
        from ragsieve.prune.head import sentences_in_passages

        return finite(await served.prune_batcher.score(sentences_in_passages(call.layout)))
    return finite(await asyncio.to_thread(stages.pruner.score, call.layout))  # another sentence scorer


def _request_pruner(body: FilterRequest, served: ServedModels, stages: SieveStages) -> SentencePruner | None:
    """The pruning the request asks for: at its own threshold, the served sieve's (``true``, or by default when
    the sieve prunes), or none (``false``, or nothing configured and nothing asked); ``prune_token_cap`` cuts the
    kept documents together within that many tokens (at the request's threshold if it sent one)."""
    if body.prune is False:
        if body.prune_token_cap is not None:
            raise ServeError(400, "prune_token_cap needs pruning: drop prune: false, or the token cap")
        return None
    if body.prune is True and stages.pruner is None and body.prune_token_cap is None:
        raise ServeError(400, "prune: no pruning configured (serve a sieve that prunes, or send prune as a "
                         "number in [0, 1])")
    if body.prune_token_cap is None and not isinstance(body.prune, float):
        return stages.pruner  # None or true: the served sieve's
    pruner = stages.pruner or SentencePruner(served.pruner or served.ranker)
    threshold = None
    if isinstance(body.prune, float):
        # a [0, 1] threshold is on the sentence scorer's scale (a keep head's is its own, not the reranker's)
        threshold = float(body.prune) if body.raw_scores else pruner.scorer.raw_threshold(body.prune)
    if body.prune_token_cap is None:
        return pruner.at(threshold)
    return replace(pruner, scope="across", token_cap=body.prune_token_cap, max_sentences=None, threshold=threshold)


def _shown_prune_threshold(raw: float | None, raw_scores: bool, stages: SieveStages) -> float | None:
    """The prune cut as the client reads it: raw, or on the sentence scorer's [0, 1] scale."""
    if raw is None or not np.isfinite(raw):
        return None
    return float(raw if raw_scores else stages.pruner.scorer.unit_scores([raw])[0])


def _pruned_out(cut: PrunedPassage) -> PrunedOut:
    return PrunedOut(text=cut.text, kept_spans=cut.kept_spans, sentences=len(cut.spans), kept_sentences=cut.n_kept,
                     tokens_before=cut.tokens_before, tokens_after=cut.tokens_after)
