"""Reranker training losses, one per file (sentence-transformers style)."""

from ragsieve.rerank.losses.info_nce import GroupInfoNCELoss

__all__ = ["GroupInfoNCELoss"]
