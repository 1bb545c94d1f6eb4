"""The LLM-side stages a server can hold: the CBDR gate (/v1/gate) and the whole pipeline (/v1/ask).

Both load only when the config names an LLM (and a probe for the gate), so a plain
rerank server stays light. They share one local LLM, and the probe's early-exit hook
must never fire inside a generation, so every use of the LLM holds one lock; gate
requests are still batched (the probe scores many questions in one pass).

Example::

    stages = LLMStages.load(ServeConfig(reranker="bm25", llm="embedded:smollm2-135m-instruct",
                                        probe="embedded:smollm2-nq", cbdr_beta=0.5))
    await stages.gate_batcher.score([("who wrote hamlet", "")])   # Conf(Q)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.rerank.base import BaseRanker
from ragsieve.serve.batcher import Batcher, PairBatcher
from ragsieve.serve.config import ServeConfig

if TYPE_CHECKING:
    from ragsieve.pipeline.rag import RAGAnswer, RAGPipeline


class _ProbeScores(BaseRanker):
    """Conf(Q) as a pair scorer (the passage is ignored), so the batcher can batch gate requests."""

    name = "probe"

    def __init__(self, probe: Any, lock: threading.Lock):
        self.probe, self.lock = probe, lock

    def score_pairs(self, queries: Sequence[str], passages: Sequence[Passage | str]) -> np.ndarray:
        with self.lock:
            return np.asarray(self.probe.score_batch(list(queries)), dtype=float)


@dataclass
class LLMStages:
    pipeline: "RAGPipeline"
    lock: threading.Lock
    beta: float
    gate_batcher: Optional[Batcher] = None
    retrieve: bool = False  # an index is configured

    @classmethod
    def load(cls, config: ServeConfig, ranker: BaseRanker, grader: Any = None,
             batcher: Callable[..., Batcher] = PairBatcher, pruner: BaseRanker | None = None
             ) -> Optional["LLMStages"]:
        if not config.llm:
            return None
        from ragsieve.gate import CBDRGate
        from ragsieve.models import load_llm
        from ragsieve.pipeline.config import PipelineConfig
        from ragsieve.pipeline.rag import RAGPipeline
        from ragsieve.pipeline.stages import SieveStages
        from ragsieve.registry import load_probe

        llm = load_llm(config.llm)
        retriever = None
        if config.index:
            from ragsieve.retrieve import load_index

            retriever = load_index(config.index)
        lock = threading.Lock()
        gate, gate_batcher = None, None
        if config.probe:
            probe = load_probe(config.probe, llm)
            gate = CBDRGate(probe, config.cbdr_beta)
            gate_batcher = batcher(
                _ProbeScores(probe, lock),
                max_wait_ms=config.max_wait_ms,
                max_batch_tokens=config.max_batch_tokens,
                max_slice_tokens=config.max_slice_tokens,
                max_batch_pairs=config.max_batch_pairs,
                name="probe",
            )
        # the one assembler, on the models this server already holds (the reranker and grader only
        # act on retrieved passages: without an index there are none)
        retrieving = retriever is not None
        # as the served sieve keeps and prunes (the one reading of its settings, SieveStages.from_config)
        stages = (SieveStages.from_config(config, ranker, grader, pruner_scorer=pruner) if retrieving
                  else SieveStages(None, None, top_k=config.top_k))
        pipeline = RAGPipeline.from_config(
            PipelineConfig(llm=config.llm, top_k=config.top_k, candidates=max(config.candidates, config.top_k),
                           max_new_tokens=config.max_new_tokens),
            llm=llm, retriever=retriever, stages=stages, gate=gate,
        )
        return cls(pipeline, lock, config.cbdr_beta, gate_batcher, retriever is not None)

    def answer(self, question: str) -> "RAGAnswer":
        with self.lock:
            return self.pipeline.answer(question, retrieve=self.retrieve)

    def close(self) -> None:
        if self.gate_batcher is not None:
            self.gate_batcher.close()
