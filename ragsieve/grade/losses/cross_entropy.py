"""Cross-entropy over the grader's output classes (or over the whole vocabulary)."""

from __future__ import annotations

import torch
from torch import nn


class CrossEntropyLoss(nn.Module):
    """Mean ``-log softmax(logits)[label]``.

    Inputs: ``logits`` of shape ``(N, C)`` and integer ``labels`` of shape ``(N,)`` in
    ``[0, C)``. A classifier grader passes ``C = 2`` (label 1 = relevant); a generative
    grader passes its next-token logits over the whole vocabulary with the ids of the
    "yes" / "no" tokens as labels, which is exactly "train it to emit the verdict token"
    (``accepts_token_targets``).

    Example::

        >>> import torch
        >>> loss = CrossEntropyLoss()
        >>> round(float(loss(torch.tensor([[0.0, 0.0]]), torch.tensor([1]))), 4)  # log 2
        0.6931
    """

    accepts_token_targets = True

    @classmethod
    def from_options(cls, options) -> "CrossEntropyLoss":
        """Build from a training config (nothing to read)."""
        return cls()

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.float(), labels.long())
