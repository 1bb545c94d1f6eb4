"""Contrastive margin loss between the output vector and the label vectors.

The lightweight-grader paper's appendix trains the classifier with a contrastive loss
with margin ``m = 1`` on the distance between the output vector and the label vector.
Read as the classic contrastive loss (Hadsell et al., 2006) with one "similar" and one
"dissimilar" partner: the output is pulled onto its own label's one-hot vector and
pushed at least ``m`` away from the other label's.
"""

from __future__ import annotations

import torch
from torch import nn


class ContrastiveMarginLoss(nn.Module):
    """``mean( d(o, e_y)^2 + max(0, m - d(o, e_{1-y}))^2 )`` with ``o = softmax(logits)``.

    ``d`` is the Euclidean distance, ``e_k`` the one-hot vector of class ``k`` and ``m``
    the margin (1 by default). With probabilities on the simplex, ``d(o, e_y)`` lies in
    ``[0, sqrt(2)]``, so a margin of 1 is reachable and the push term vanishes once the
    output is confidently on its own side.

    Inputs: ``logits`` of shape ``(N, 2)`` and ``labels`` of shape ``(N,)`` in {0, 1}.

    Example (hand-computed: ``o = [0.5, 0.5]``, ``d(o, e_1)^2 = 0.5``,
    ``d(o, e_0) = sqrt(0.5)``, so the loss is ``0.5 + (1 - 0.7071)^2 = 0.5858``)::

        >>> import torch
        >>> loss = ContrastiveMarginLoss(margin=1.0)
        >>> round(float(loss(torch.tensor([[0.0, 0.0]]), torch.tensor([1]))), 4)
        0.5858
    """

    accepts_token_targets = False

    def __init__(self, margin: float = 1.0):
        super().__init__()
        if margin <= 0:
            raise ValueError(f"margin must be > 0, got {margin}")
        self.margin = margin

    @classmethod
    def from_options(cls, options) -> "ContrastiveMarginLoss":
        """Build from a training config (reads ``options.margin``)."""
        return cls(margin=options.margin)

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if logits.ndim != 2 or logits.shape[1] != 2:
            raise ValueError(f"contrastive loss needs (N, 2) logits, got {tuple(logits.shape)}")
        probs = torch.softmax(logits.float(), dim=-1)
        own = nn.functional.one_hot(labels.long(), 2).to(probs.dtype)
        pull = ((probs - own) ** 2).sum(-1)
        push = torch.clamp(self.margin - torch.linalg.vector_norm(probs - (1 - own), dim=-1), min=0) ** 2
        return (pull + push).mean()
