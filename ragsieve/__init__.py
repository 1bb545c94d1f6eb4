"""ragsieve: LLM-aware post-retrieval filtering for RAG.

Pipeline: gate (CBDR) → retrieve → rerank → grade → generate. This module is the front
door: every public name below imports on first use, so ``import ragsieve`` loads no ML
library. The ``TYPE_CHECKING`` block mirrors the lazy table for type checkers and IDEs.

Example::

    from ragsieve import PipelineConfig, RAGPipeline, load_reranker
    load_reranker("bm25").top_k("who wrote hamlet", ["Shakespeare wrote Hamlet.", "Paris"], 1)
    pipe = RAGPipeline.from_config(PipelineConfig(index="index/nq", reranker="embedded:base"))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from ragsieve.data import Dataset, LabeledPair, Passage, Question, load_dataset
    from ragsieve.errors import RagsieveError
    from ragsieve.gate import CBDRGate
    from ragsieve.grade import Grader, GradeResult
    from ragsieve.models import load_encoder, load_llm
    from ragsieve.pipeline import PipelineConfig, RAGAnswer, RAGPipeline, Sieve
    from ragsieve.probe import ConfidenceProbe
    from ragsieve.registry import load_grader, load_probe, load_reranker, new_grader
    from ragsieve.rerank import BaseRanker, RankedResult, RankedResults
    from ragsieve.retrieve import build_index, load_index

#: public name → the module that defines it
_EXPORTS: dict[str, str] = {
    "Dataset": "ragsieve.data",
    "LabeledPair": "ragsieve.data",
    "Passage": "ragsieve.data",
    "Question": "ragsieve.data",
    "load_dataset": "ragsieve.data",
    "RagsieveError": "ragsieve.errors",
    "CBDRGate": "ragsieve.gate",
    "Grader": "ragsieve.grade",
    "GradeResult": "ragsieve.grade",
    "load_encoder": "ragsieve.models",
    "load_llm": "ragsieve.models",
    "PipelineConfig": "ragsieve.pipeline",
    "RAGAnswer": "ragsieve.pipeline",
    "RAGPipeline": "ragsieve.pipeline",
    "Sieve": "ragsieve.pipeline",
    "ConfidenceProbe": "ragsieve.probe",
    "load_grader": "ragsieve.registry",
    "load_probe": "ragsieve.registry",
    "load_reranker": "ragsieve.registry",
    "new_grader": "ragsieve.registry",
    "BaseRanker": "ragsieve.rerank",
    "RankedResult": "ragsieve.rerank",
    "RankedResults": "ragsieve.rerank",
    "build_index": "ragsieve.retrieve",
    "load_index": "ragsieve.retrieve",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'ragsieve' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
