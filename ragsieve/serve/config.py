""":class:`ServeConfig`: what ``ragsieve serve`` loads and the limits it enforces.

Example::

    from ragsieve.serve import ServeConfig, create_app
    app = create_app(ServeConfig(reranker="bm25", max_documents=100))
"""

from __future__ import annotations

from pydantic import Field, SecretStr

from ragsieve.config import StrictConfig


class ServeConfig(StrictConfig):
    """Models (by registry spec) and request limits of the rerank / filter service."""

    reranker: str = "embedded:base"  # any reranker spec of ragsieve.registry, or evolve:<store> (its latest round)
    grader: str | None = None  # saved grader folder or embedded:<name>; None = /v1/filter uses the ranker's threshold
    model_name: str | None = None  # the id clients see in responses and /v1/models (default: the reranker spec)
    # /v1/gate and /v1/ask: a local LLM (+ probe) only when configured, so a plain rerank server stays light
    llm: str | None = None
    probe: str | None = None  # probe folder or embedded:<name> for /v1/gate (and the gate inside /v1/ask)
    cbdr_beta: float = Field(0.5, ge=0.0, le=1.0)
    index: str | None = None  # retrieval index for /v1/ask (without one, /v1/ask answers closed-book)
    top_k: int = Field(3, ge=1, description="/v1/ask: passages that reach the LLM")
    candidates: int = Field(20, ge=1, description="/v1/ask: passages retrieved for the reranker")
    max_new_tokens: int = Field(16, ge=1)
    feedback_store: str | None = None  # evolve store directory that /v1/feedback appends to

    # limits: over-limit requests are answered 413 with a JSON error naming the field
    max_documents: int = Field(1000, ge=1)
    max_document_chars: int = Field(50_000, ge=1)
    max_query_chars: int = Field(10_000, ge=1)
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1024)
    max_chunks_per_doc: int = Field(
        8, ge=1, description="a document longer than the model window is split into at most this many chunks"
    )

    # dynamic batching: concurrent requests are scored together in one score_pairs call
    max_wait_ms: float = Field(5.0, ge=0.0, description="how long the first request of a batch waits for company")
    max_batch_pairs: int = Field(256, ge=1)

    api_key: SecretStr | None = None  # every endpoint but /health needs it (Bearer or X-API-Key)
