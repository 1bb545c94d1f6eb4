""":class:`PipelineConfig`: what a RAG pipeline is made of, validated before anything loads.

Every stage is named by a spec (see :mod:`ragsieve.registry`), so the same config runs
the embedded defaults on a laptop or an 8B model behind an endpoint. Bad values are
refused here, in one line, before a model is loaded or a folder is created.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal, Optional

from pydantic import Field, model_validator

from ragsieve.config import StrictConfig
from ragsieve.models.specs import DEFAULT_LLM

if TYPE_CHECKING:
    from ragsieve.pipeline.sieve_config import SieveConfig

DEFAULT_PROBE = "embedded:smollm2-nq"


class PipelineConfig(StrictConfig):
    """gate (CBDR) → retrieve → rerank → grade → generate, each stage optional.

    Example::

        cfg = PipelineConfig(index="index/nq", reranker="embedded:base", candidates=20, top_k=3)
        RAGPipeline.from_config(cfg).answer("who wrote hamlet").answer
    """

    llm: str = DEFAULT_LLM
    index: Optional[str] = None  # index folder; None = closed-book only
    sieve: Optional[str] = None  # a fitted sieve folder: its gate, reranker, grader and sizes
    top_k: int = Field(3, ge=1, description="passages that reach the LLM")
    passage_order: Literal["best_first", "best_last"] = "best_first"
    candidates: int = Field(20, ge=1, description="passages retrieved for the reranker to choose from")
    reranker: Optional[str] = None  # reranker spec, e.g. embedded:base
    grader: Optional[str] = None  # grader folder or embedded:<name>
    prune_threshold: Optional[float] = Field(
        None, allow_inf_nan=False, description="keep each kept passage's sentences scoring >= this (raw)")
    pruner: Optional[str] = None  # sentence scorer spec for pruning; None: the reranker
    prune_max_sentences: Optional[int] = Field(None, ge=1)  # at most this many sentences per kept passage
    prune_scope: Literal["passage", "across"] = "passage"  # across: the caps hold over all kept passages together
    prune_token_cap: Optional[int] = Field(None, ge=1)  # across: the kept sentences' tokens in all, at most
    cbdr_beta: Optional[float] = Field(None, ge=0.0, le=1.0, description="answer closed-book when Conf(Q) > β")
    probe: str = DEFAULT_PROBE  # probe folder or embedded:<name>, used when cbdr_beta is set
    max_prompt_tokens: int = Field(1024, ge=64)
    max_new_tokens: int = Field(16, ge=1)
    batch_size: int = Field(8, ge=1)
    timeout: Optional[float] = Field(None, gt=0, description="endpoint LLMs: seconds per try")
    retries: Optional[int] = Field(None, ge=0, description="endpoint LLMs: extra tries")

    @model_validator(mode="after")
    def _sieve_or_stages(self) -> "PipelineConfig":
        if self.sieve and (self.reranker or self.grader or self.cbdr_beta is not None or self.pruner):
            raise ValueError("a sieve brings its own gate, reranker, grader and pruner: give either sieve or those")
        return self

    def expanded(self) -> "PipelineConfig":
        """With a sieve, the same config with the sieve's stages and sizes filled in (paths resolved)."""
        if not self.sieve:
            return self
        from ragsieve.pipeline.sieve_config import read_sieve_config, sieve_folder

        folder = sieve_folder(self.sieve)
        return self.with_sieve(read_sieve_config(folder), folder)

    def with_sieve(self, sc: "SieveConfig", folder: str | Path) -> "PipelineConfig":
        """This config with the stages and sizes of sieve config ``sc`` (its components found in ``folder``): how
        a folder's ``sieve.json``, or a :class:`~ragsieve.pipeline.sieve.Sieve` built from a changed config, runs."""
        from ragsieve.pipeline.sieve_config import resolve_component

        def part(value: str | None) -> str | None:
            return resolve_component(folder, value) if value else None

        gated = sc.probe is not None and sc.beta is not None
        # a sieve's top_k may be 0 (fit found closed book best): model_copy keeps it unvalidated, on purpose
        return self.model_copy(update={
            "sieve": None, "llm": sc.llm, "probe": part(sc.probe) if gated else self.probe,
            "cbdr_beta": sc.beta if gated else None, "reranker": part(sc.reranker), "grader": part(sc.grader),
            "top_k": sc.top_k, "passage_order": sc.passage_order, "candidates": max(sc.candidates, sc.top_k),
            # a request's own prune threshold wins over the sieve's
            "prune_threshold": self.prune_threshold if self.prune_threshold is not None else sc.prune_threshold,
            "pruner": part(sc.pruner),
            "prune_max_sentences": (self.prune_max_sentences if self.prune_max_sentences is not None
                                    else sc.prune_max_sentences),
            # a request's own token cap wins too (it cuts across the kept passages)
            "prune_scope": "across" if self.prune_token_cap is not None else sc.prune_scope,
            "prune_token_cap": self.prune_token_cap if self.prune_token_cap is not None else sc.prune_token_cap,
            "max_prompt_tokens": sc.max_prompt_tokens,
            "max_new_tokens": sc.max_new_tokens,
        })

    @property
    def prunes(self) -> bool:
        """Whether its own settings prune (a sieve's are read by :meth:`expanded`)."""
        return any(v is not None for v in (self.prune_threshold, self.prune_max_sentences, self.prune_token_cap))

    @model_validator(mode="after")
    def _pruner_has_a_scorer(self) -> "PipelineConfig":
        if self.prunes and not (self.sieve or self.reranker or self.pruner):
            raise ValueError("pruning (prune_threshold, prune_max_sentences) needs a sentence scorer: give a reranker, "
                             "a pruner or a sieve")
        return self

    @model_validator(mode="after")
    def _candidates_cover_top_k(self) -> "PipelineConfig":
        if self.reranker and self.candidates < self.top_k:
            raise ValueError(f"candidates ({self.candidates}) must be >= top_k ({self.top_k}) when reranking")
        return self
