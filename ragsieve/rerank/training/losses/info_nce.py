"""Group InfoNCE for cross-encoders: one positive against its own hard negatives.

sentence-transformers' ``MultipleNegativesRankingLoss`` always adds random in-batch
negatives (``num_negatives=0`` fails) and squashes logits with a sigmoid. The
knowledge-boundary method wants a plain softmax over (1 positive + N given negatives)
of raw logits at temperature τ, so this subclass yields no in-batch negatives and
scales logits by 1/τ.
"""

from __future__ import annotations

from collections.abc import Generator

from sentence_transformers.cross_encoder.losses import MultipleNegativesRankingLoss


class GroupInfoNCELoss(MultipleNegativesRankingLoss):
    """``-log softmax(s(q, p+) / τ over [p+, n_1..n_N])`` with s the cross-encoder logit.

    Inputs: columns ``(query, positive, negative_1, ..., negative_N)``, no labels; the
    model must have ``num_labels=1``.

    Example::

        from sentence_transformers.cross_encoder import CrossEncoder
        model = CrossEncoder("path/to/minilm", num_labels=1)
        loss = GroupInfoNCELoss(model, temperature=1.0)
        # CrossEncoderTrainer(model=model, train_dataset=groups, loss=loss).train()
    """

    def __init__(self, model, temperature: float = 1.0) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        super().__init__(model, num_negatives=None, scale=1.0 / temperature, activation_fn=None)
        self.temperature = temperature

    def get_in_batch_negatives(self, anchors, candidates) -> Generator[list[str], None, None]:
        # Only the group's own negatives count: nothing is borrowed from other queries.
        yield from ()

    def get_config_dict(self) -> dict[str, float]:
        return {"temperature": self.temperature}
