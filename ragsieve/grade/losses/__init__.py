"""Grader training losses, one per file (sentence-transformers style).

Every loss is an ``nn.Module`` called as ``loss(logits, labels)``; :data:`LOSSES` maps
the config name to the class.
"""

from ragsieve.grade.losses.contrastive import ContrastiveMarginLoss
from ragsieve.grade.losses.cross_entropy import CrossEntropyLoss

LOSSES = {
    "cross_entropy": CrossEntropyLoss,
    "contrastive": ContrastiveMarginLoss,
}

__all__ = ["LOSSES", "ContrastiveMarginLoss", "CrossEntropyLoss"]
