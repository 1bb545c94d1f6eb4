"""End-to-end RAG: gate → retrieve → rerank → grade → generate, assembled by :class:`PipelineConfig`
or fitted to one LLM as a :class:`Sieve`."""

from ragsieve.pipeline.config import PipelineConfig
from ragsieve.pipeline.rag import CandidateTrace, RAGAnswer, RAGPipeline
from ragsieve.pipeline.sieve import Sieve
from ragsieve.pipeline.stages import FilterResult, SieveStages
from ragsieve.pipeline.sieve_config import SieveConfig, read_sieve_config
from ragsieve.prompts import first_line
from ragsieve.prompts.builder import BuiltPrompt, PromptBuilder

__all__ = [
    "BuiltPrompt", "CandidateTrace", "FilterResult", "PipelineConfig", "PromptBuilder", "RAGAnswer", "RAGPipeline",
    "Sieve", "SieveConfig", "SieveStages", "first_line", "read_sieve_config",
]
