"""Reranker training losses, one per file (sentence-transformers style)."""

from ragsieve.rerank.training.losses.info_nce import GroupInfoNCELoss
from ragsieve.rerank.training.losses.info_nce_distill import GroupInfoNCEDistillLoss

__all__ = ["GroupInfoNCEDistillLoss", "GroupInfoNCELoss"]
