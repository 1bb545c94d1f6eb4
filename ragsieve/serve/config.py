""":class:`ServeConfig`: what ``ragsieve serve`` loads and the limits it enforces.

Example::

    from ragsieve.serve import ServeConfig, create_app
    app = create_app(ServeConfig(reranker="bm25", max_documents=100))
    app = create_app(ServeConfig(sieve="sieves/mine"))   # a fitted sieve: its reranker, grader, LLM, probe and β
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from ragsieve.config import StrictConfig
from ragsieve.rerank.chunks import MAX_CHUNKS_PER_DOC
from ragsieve.rerank.vectors import DEFAULT_CACHE_MB


class ServeConfig(StrictConfig):
    """Models (by registry spec) and request limits of the rerank / filter service."""

    sieve: str | None = None  # a fitted sieve folder (`ragsieve fit`): brings reranker, grader, llm, probe, β
    reranker: str = "embedded:base"  # any reranker spec of ragsieve.registry, or evolve:<store> (its latest round)
    # a CalibrationFile (`ragsieve rerank calibrate`) fitted on the user's labelled pairs for this reranker: the
    # [0, 1] scores /v1/rerank answers become probabilities on their data (refused if fitted on other weights)
    calibration: str | None = None
    grader: str | None = None  # saved grader folder or embedded:<name>; None = /v1/filter uses the ranker's threshold
    # /v1/filter and /v1/ask prune each kept document to its sentences whose raw score is >= this (a sieve's own);
    # None: documents stay whole unless a request sends a threshold
    prune_threshold: float | None = Field(None, allow_inf_nan=False)
    prune_max_sentences: int | None = Field(None, ge=1)  # and at most this many sentences per document
    pruner: str | None = None  # the sentence scorer spec (a sieve's own, e.g. prune-head); None: the reranker
    prune_scope: Literal["passage", "across"] = "passage"  # a sieve's own: across = the caps over all kept documents
    prune_token_cap: int | None = Field(None, ge=1)  # a sieve's own (scope across): kept sentences' tokens in all
    # /v1/filter without a grader or a request threshold: True keeps the top_k ungraded, as Sieve.filter does for
    # a sieve fitted without a grader (set when serving a sieve); False answers 400 (a bare reranker has no cut)
    keep_ungraded: bool = False
    model_name: str | None = None  # the id clients see in responses and /v1/models (default: the reranker spec)
    # /v1/gate and /v1/ask: a local LLM (+ probe) only when configured, so a plain rerank server stays light
    llm: str | None = None
    probe: str | None = None  # probe folder or embedded:<name> for /v1/gate (and the gate inside /v1/ask)
    cbdr_beta: float = Field(0.5, ge=0.0, le=1.0)
    index: str | None = None  # retrieval index for /v1/ask (without one, /v1/ask answers closed-book)
    top_k: int = Field(3, ge=1, description="/v1/ask: passages that reach the LLM; /v1/filter: its cut (top_n overrides)")
    candidates: int = Field(20, ge=1, description="/v1/ask: passages retrieved for the reranker")
    max_new_tokens: int = Field(16, ge=1)
    feedback_store: str | None = None  # evolve store that /v1/feedback appends to: its folder or a postgresql:// URL
    log_traffic: bool = False  # also write every served (query, documents) to feedback_store as unlabelled traffic

    # limits: over-limit requests are answered 413 with a JSON error naming the field
    max_documents: int = Field(1000, ge=1)
    max_document_chars: int = Field(50_000, ge=1)
    max_query_chars: int = Field(10_000, ge=1)
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1024)
    # pairs one request may have scored, counting each window of a chunked document: a request's model time
    max_pairs_per_request: int = Field(4096, ge=1)
    max_chunks_per_doc: int = Field(
        MAX_CHUNKS_PER_DOC, ge=1, description="a document longer than the model window is split into at most this many chunks"
    )

    # dynamic batching: concurrent requests are scored together in one score_pairs call
    max_wait_ms: float = Field(5.0, ge=0.0, description="how long the first request of a batch waits for company")
    # token budgets (a pair costs its padded width, as in TEI's max_batch_tokens): a model call holds pairs of one
    # padded width from every waiting request, up to max_batch_tokens, so each forward pass is as full as offline;
    # each request gives a call at most max_slice_tokens of its pairs, and the request with the fewest tokens left
    # chooses the width, so a short request joins the very next call and waits for at most one slice of a big one
    # (2048 tokens: eight 256-token windows, ~0.4 s on 2 cores; bench/results/serve_fairness.json measures both)
    max_batch_tokens: int = Field(16384, ge=1)
    max_slice_tokens: int = Field(2048, ge=1)
    # and at most this many pairs a call; on Ray Serve (whose @serve.batch counts items) the batch size itself
    max_batch_pairs: int = Field(128, ge=1)
    # passage vectors of the reranker's cosine half, shared by every request of the process (one per Ray replica):
    # RAG traffic reranks one corpus, so a document seen before is not encoded again (0: no cache)
    embedding_cache_mb: float = Field(DEFAULT_CACHE_MB, ge=0.0)
    # SIGTERM (Kubernetes' termination contract): /ready answers 503 at once and requests are still answered for
    # drain_s, so a load balancer probing readiness every 10 s (Kubernetes' default periodSeconds) stops sending
    # before the server stops accepting; then in-flight requests have shutdown_grace_s to finish before the server
    # exits anyway (a pod's terminationGracePeriodSeconds should exceed the two together)
    drain_s: float = Field(10.0, ge=0.0)
    shutdown_grace_s: float = Field(30.0, ge=0.0)

    api_key: SecretStr | None = None  # every endpoint but /health needs it (Bearer or X-API-Key)

    @model_validator(mode="after")
    def _traffic_needs_a_store(self) -> "ServeConfig":
        if self.log_traffic and not self.feedback_store:  # refused before any model loads
            raise ValueError("log_traffic (--log-traffic) needs feedback_store (--feedback-store): the evolve store "
                             "the traffic goes to")
        return self

    @model_validator(mode="after")
    def _sieve_or_stages(self) -> "ServeConfig":
        given = self.model_fields_set & _SIEVE_FIELDS
        if self.sieve and given:
            raise ValueError(f"a sieve brings its own stages: give either sieve or {', '.join(sorted(given))}")
        return self

    def expanded(self) -> "ServeConfig":
        """With a sieve, the same config with the sieve's stages and sizes filled in (paths resolved).

        The sieve is read by :meth:`PipelineConfig.expanded`, the one reader of ``sieve.json``.
        """
        if not self.sieve:
            return self
        from pathlib import Path

        from ragsieve.pipeline.config import PipelineConfig

        p = PipelineConfig(sieve=self.sieve).expanded()
        gated = p.cbdr_beta is not None
        update = {
            "sieve": None, "reranker": p.reranker or "none", "grader": p.grader, "llm": p.llm,
            "probe": p.probe if gated else None, "top_k": p.top_k, "candidates": p.candidates,
            "max_new_tokens": p.max_new_tokens, "model_name": self.model_name or f"sieve:{Path(self.sieve).name}",
            "prune_threshold": p.prune_threshold, "prune_max_sentences": p.prune_max_sentences, "pruner": p.pruner,
            "prune_scope": p.prune_scope, "prune_token_cap": p.prune_token_cap,
            "keep_ungraded": True,
        }
        if gated:
            update["cbdr_beta"] = p.cbdr_beta
        return ServeConfig.model_validate({**self.model_dump(exclude={"api_key"}), **update, "api_key": self.api_key})


# what a sieve decides; giving one of these next to --sieve is refused, not silently overridden
_SIEVE_FIELDS = frozenset({"reranker", "grader", "llm", "probe", "cbdr_beta", "prune_threshold",
                           "prune_max_sentences", "pruner", "prune_scope", "prune_token_cap"})
