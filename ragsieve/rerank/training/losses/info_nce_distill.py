"""Group InfoNCE plus a KL pull towards the start model's own scores (a forgetting guard).

Fine-tuning the base reranker on an LLM's confidence-shift preferences alone moves it far
from general relevance (issue #18). This loss adds, per group, the KL divergence from the
*frozen start model's* softmax over the same documents to the student's softmax, so the
reranker moves away from its starting order only as far as the preferences pay for:

    InfoNCE(s / τ)  +  w · KL( softmax(t / τ) || softmax(s / τ) )

with ``s`` the student's logits, ``t`` the start model's logits on the same (query, doc)
pairs (computed once before training and stored in the dataset's ``label`` column) and
``τ`` the InfoNCE temperature, applied to both sides as in knowledge distillation. The
sum itself is :func:`ragsieve.rerank.training.distill.group_distill_loss`.

With ``w = 0`` this is :class:`~ragsieve.rerank.training.losses.GroupInfoNCELoss` to the bit: the
logits are laid out and scaled by the same code path (tested).
"""

from __future__ import annotations

import torch

from ragsieve.rerank.training.distill import group_distill_loss
from ragsieve.rerank.training.losses.info_nce import GroupInfoNCELoss


class GroupInfoNCEDistillLoss(GroupInfoNCELoss):
    """Group InfoNCE at temperature τ plus ``distill_weight`` × KL to the start model's logits.

    Inputs: columns ``(query, positive, negative_1, ..., negative_N)`` and a ``label``
    column holding the start model's ``1 + N`` raw logits of the same docs (unused when
    ``distill_weight`` is 0); the model must have ``num_labels=1``.

    Example::

        from sentence_transformers.cross_encoder import CrossEncoder
        model = CrossEncoder("ragsieve/assets/base-reranker", num_labels=1)
        loss = GroupInfoNCEDistillLoss(model, temperature=1.0, distill_weight=1.0)
        columns = [["who wrote hamlet"], ["Shakespeare wrote Hamlet."], ["Paris is in France."]]
        loss(columns, [torch.tensor([2.0, -1.0])])   # tensor(...), InfoNCE + KL
    """

    def __init__(self, model, temperature: float = 1.0, distill_weight: float = 1.0) -> None:
        if distill_weight < 0:
            raise ValueError(f"distill_weight must be >= 0, got {distill_weight}")
        super().__init__(model, temperature=temperature)
        self.distill_weight = distill_weight

    def forward(self, inputs, labels, prompt=None, task=None) -> torch.Tensor:
        anchors = inputs[0]
        batch_size = len(anchors)
        scores = [self.call_model_with_columns(anchors, column, prompt=prompt, task=task) for column in inputs[1:]]
        # the parent's calculate_loss layout and scaling: (batch, 1 + N) logits / τ
        logits = torch.cat(scores, dim=0).reshape(-1, batch_size).T * self.scale
        if self.distill_weight == 0:
            return group_distill_loss(logits, logits, 0.0, 1.0)  # the teacher is not read at weight 0
        teacher = torch.stack([torch.as_tensor(t, dtype=torch.float32) for t in labels]).to(logits.device)
        if teacher.shape != logits.shape:
            raise ValueError(f"teacher logits {tuple(teacher.shape)} do not match the group {tuple(logits.shape)}")
        # teacher_scale = 1/τ: the start model's logits at the same temperature as the student's
        return group_distill_loss(logits, teacher, self.distill_weight, self.scale)

    def get_config_dict(self) -> dict[str, float]:
        return {"temperature": self.temperature, "distill_weight": self.distill_weight}
