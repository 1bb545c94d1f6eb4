"""``/v1/gate`` (CBDR: retrieve or not) and ``/v1/ask`` (the whole pipeline), when an LLM is configured."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Body, Depends

from ragsieve.serve.errors import ServeError
from ragsieve.serve.models import ServedModels
from ragsieve.serve.rag import LLMStages
from ragsieve.serve.schemas import AskRequest, AskResponse, Context, GateRequest, GateResponse
from ragsieve.serve.state import ERRORS, ServeState, finite, serve_state

router = APIRouter(tags=["rag"])


def llm_stages(models: ServedModels) -> LLMStages:
    stages = models.llm
    if stages is None:
        raise ServeError(400, "no LLM configured (start with --llm, and --probe for the gate)")
    return stages


@router.post("/v1/gate", response_model=GateResponse, responses=ERRORS,
             summary="CBDR: Conf(Q) and whether to retrieve (Conf(Q) <= beta)")
async def gate(body: GateRequest = Body(...), state: ServeState = Depends(serve_state)):
    query, _ = state.check(body.query, [])
    async with state.snapshot() as models:
        stages = llm_stages(models)
        if stages.gate_batcher is None:
            raise ServeError(400, "no probe configured (start with --probe)")
        conf = float(finite(await stages.gate_batcher.score([(query, "")]))[0])
    beta = body.beta if body.beta is not None else stages.beta
    return GateResponse(confidence=conf, retrieve=conf <= beta, beta=beta)


@router.post("/v1/ask", response_model=AskResponse, responses=ERRORS,
             summary="Answer with the whole pipeline: gate → retrieve → rerank → grade → generate")
async def ask(body: AskRequest = Body(...), state: ServeState = Depends(serve_state)):
    query, _ = state.check(body.query, [])
    async with state.snapshot() as models:  # a reload waits for the answer before closing these models
        result = await asyncio.to_thread(llm_stages(models).answer, query)
    return AskResponse(
        answer=result.answer,
        retrieved=result.retrieved,
        confidence=result.confidence,
        contexts=[Context(id=p.id, text=p.text, title=p.title) for p in result.contexts],
        graded_out=result.graded_out,
        seconds=result.seconds,
    )
