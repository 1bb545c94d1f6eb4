"""``/v1/feedback``: relevance feedback appended to the evolve store (when one is configured)."""

from __future__ import annotations

import asyncio
import logging
from typing import Union

from fastapi import APIRouter, Body, Depends, Request

from ragsieve.errors import RagsieveError
from ragsieve.evolve.live import FeedbackItem, append_feedback, pending_feedback
from ragsieve.serve.errors import ServeError, request_id
from ragsieve.serve.schemas import FeedbackResponse
from ragsieve.serve.state import ERRORS, ServeState, serve_state

log = logging.getLogger("ragsieve.serve")

router = APIRouter(tags=["feedback"])


@router.post(
    "/v1/feedback",
    response_model=FeedbackResponse,
    responses=ERRORS,
    summary="Append relevance feedback to the evolve store",
)
async def feedback(
    request: Request,
    body: Union[FeedbackItem, list[FeedbackItem]] = Body(...),
    state: ServeState = Depends(serve_state),
):
    config = state.config
    if not config.feedback_store:
        raise ServeError(400, "no feedback store configured (start with --feedback-store)")
    items = body if isinstance(body, list) else [body]
    if len(items) > config.max_documents:
        raise ServeError(413, f"body: {len(items)} feedback items, max_documents is {config.max_documents}")
    for i, item in enumerate(items):
        given = [t for t in (item.query, item.document, item.chosen, item.rejected) if t is not None]
        if any(len(t) > config.max_document_chars for t in given):
            raise ServeError(413, f"{i}: a text is longer than max_document_chars ({config.max_document_chars})")
    # sqlite waits for other writers (WAL, busy timeout): never on the event loop
    try:
        stored = await asyncio.to_thread(append_feedback, config.feedback_store, items)
        pending = await asyncio.to_thread(pending_feedback, config.feedback_store)
    except RagsieveError as exc:  # the store, not the request, is at fault (damaged, unwritable)
        state.metrics.feedback_rows.labels(outcome="dropped").inc(len(items))
        log.error("rid=%s feedback store: %s", request_id(request), exc)
        raise ServeError(503, f"feedback store unavailable: {str(exc).splitlines()[0]}") from None
    state.metrics.feedback_rows.labels(outcome="written").inc(stored)
    log.info("rid=%s feedback: %d row(s) from %s", request_id(request), stored, sorted({x.source for x in items}))
    return FeedbackResponse(stored=stored, pending=pending, request_id=request_id(request))
