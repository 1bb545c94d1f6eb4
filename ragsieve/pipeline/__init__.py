"""End-to-end RAG: gate → retrieve → rerank → grade → generate."""

from ragsieve.pipeline.rag import RAGAnswer, RAGPipeline
from ragsieve.prompts import first_line
from ragsieve.prompts.builder import BuiltPrompt, PromptBuilder

__all__ = ["BuiltPrompt", "PromptBuilder", "RAGAnswer", "RAGPipeline", "first_line"]
