"""The models one server holds (ranker, optional grader) and their batchers, swappable as a unit.

Example::

    served = ServedModels.load(ServeConfig(reranker="bm25"))
    await served.rank_batcher.score([("q", "text")])
    served.close()

``batcher`` makes each model's batcher: :class:`~ragsieve.serve.batcher.PairBatcher` (a worker
thread) by default, ``ServeBatcher`` (``@serve.batch``) on Ray Serve.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ragsieve.rerank.base import BaseRanker
from ragsieve.serve.batcher import Batcher, PairBatcher
from ragsieve.serve.config import ServeConfig
from ragsieve.serve.rag import LLMStages

if TYPE_CHECKING:
    from ragsieve.serve.metrics import ServeMetrics


#: ``(ranker, *, max_wait_ms, max_batch_tokens, max_slice_tokens, max_batch_pairs, name, metrics) -> Batcher``: how a server batches one model's calls
BatcherFactory = Callable[..., Batcher]


def refuse_pickled_weights(spec: str) -> None:
    """A served model folder must hold safetensors: a pickled ``.bin`` can run code when loaded."""
    from pathlib import Path

    from ragsieve.errors import ModelNotAvailable
    from ragsieve.registry import local_reranker_folder

    folder = local_reranker_folder(spec)
    if folder is None:
        return  # a registry name (bm25, embedded:base, ...) or an HF id: nothing user-supplied on disk
    pickled = any(folder.rglob("*.bin")) or any(folder.rglob("*.pt"))
    if pickled and not any(folder.rglob("*.safetensors")):
        raise ModelNotAvailable(f"{folder}: only pickled weights (.bin/.pt); serve safetensors only (save_pretrained)")


@dataclass
class ServedModels:
    ranker: BaseRanker
    rank_batcher: Batcher
    grader: BaseRanker | None = None
    grade_batcher: Batcher | None = None
    grader_name: str | None = None
    pruner: BaseRanker | None = None  # the sentence scorer when it is not the ranker (a sieve's keep head)
    prune_batcher: Batcher | None = None  # a keep head's sentences, batched across requests like the ranker's pairs
    llm: LLMStages | None = None  # /v1/gate and /v1/ask, when an LLM is configured
    # requests holding these models (ServeState.snapshot): a reload closes them once none does
    users: int = field(default=0, init=False, repr=False, compare=False)
    # set by the last request to let go once a reload waits for them (no polling)
    released: asyncio.Event | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def threshold(self) -> float | None:
        """The cut for /v1/filter: the grader's, else the ranker's own if it is a calibrated grader."""
        source = self.grader if self.grader is not None else self.ranker
        value = getattr(source, "threshold", None)
        return float(value) if isinstance(value, (int, float)) else None

    @classmethod
    def load(cls, config: ServeConfig, batcher: BatcherFactory = PairBatcher,
             metrics: "ServeMetrics | None" = None) -> ServedModels:
        from ragsieve.registry import load_grader, load_reranker
        from ragsieve.rerank.chunks import reading_whole, window_reader
        from ragsieve.rerank.vectors import vector_encoders

        refuse_pickled_weights(config.reranker)
        options = {"calibration": config.calibration} if config.calibration else {}
        # read to the served chunk cap, so the sieve (/v1/filter, /v1/rag) reads a long passage as /v1/rerank does
        ranker = reading_whole(load_reranker(config.reranker, whole_passages=False, **options),
                               config.max_chunks_per_doc)
        for encoder in vector_encoders(ranker):  # the cosine half's passage vectors, bounded as configured
            encoder.vector_cache.resize(config.embedding_cache_mb)
        batch = {"max_wait_ms": config.max_wait_ms, "max_batch_tokens": config.max_batch_tokens,
                 "max_slice_tokens": config.max_slice_tokens, "max_batch_pairs": config.max_batch_pairs,
                 "metrics": metrics}
        # the batcher scores the chunks ServeState.scores plans (one window each), so it holds the window reader
        served = cls(ranker, batcher(window_reader(ranker), name="ranker", **batch))
        if config.grader:
            served.grader = load_grader(config.grader)
            served.grade_batcher = batcher(served.grader, name="grader", **batch)
            served.grader_name = config.grader
        if config.pruner:
            served.pruner = load_reranker(config.pruner)
            if hasattr(served.pruner, "score_layout"):  # a keep head: it reads each passage whole
                from ragsieve.prune.head import HeadSentences

                served.prune_batcher = batcher(HeadSentences(served.pruner), name="pruner", **batch)
        served.llm = LLMStages.load(config, ranker, served.grader, batcher, served.pruner)
        return served

    def close(self) -> None:
        self.rank_batcher.close()
        for other in (self.grade_batcher, self.prune_batcher):
            if other is not None:
                other.close()
        if self.llm is not None:
            self.llm.close()
