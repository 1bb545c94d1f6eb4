"""End-to-end RAG: gate → retrieve → rerank → grade → generate, assembled by :class:`PipelineConfig`."""

from ragsieve.pipeline.config import PipelineConfig
from ragsieve.pipeline.rag import RAGAnswer, RAGPipeline
from ragsieve.prompts import first_line
from ragsieve.prompts.builder import BuiltPrompt, PromptBuilder

__all__ = ["BuiltPrompt", "PipelineConfig", "PromptBuilder", "RAGAnswer", "RAGPipeline", "first_line"]
