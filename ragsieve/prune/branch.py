"""The keep branch: the cross-encoder's top layers, copied and trained to tell which tokens to keep.

The reranker's lower layers read ``(query, title: passage)`` once and are shared (frozen: the rerank logit is
untouched); the branch carries on from their output with its own copy of the top ``n`` layers and a linear
token classifier. A sentence's keep logit is the mean of its tokens' logits. Initialised from the reranker's
own top layers, an untrained branch reproduces the reranker's last hidden states, so training starts from what
the reranker already reads and moves only the copy.

A BERT layer is a post-norm transformer encoder layer with GELU: :class:`torch.nn.TransformerEncoderLayer`
holds the same computation, so the copy does not depend on how a transformers release calls its layers.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn


class KeepBranch(nn.Module):
    """``n_layers`` encoder layers over the trunk's hidden states, and a linear keep logit per token."""

    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int, n_layers: int,
                 layer_norm_eps: float = 1e-12, dropout: float = 0.1):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(hidden_size, num_heads, intermediate_size, dropout, activation="gelu",
                                       layer_norm_eps=layer_norm_eps, batch_first=True)
            for _ in range(n_layers))
        self.classifier = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.classifier.weight)
        nn.init.zeros_(self.classifier.bias)

    @classmethod
    def like(cls, config, n_layers: int) -> KeepBranch:
        """An empty branch shaped for a BERT ``config``."""
        return cls(config.hidden_size, config.num_attention_heads, config.intermediate_size, n_layers,
                   config.layer_norm_eps, config.hidden_dropout_prob)

    @classmethod
    def from_bert(cls, bert, n_layers: int) -> KeepBranch:
        """A branch whose layers are copies of ``bert``'s (a ``BertModel``) top ``n_layers``."""
        branch = cls.like(bert.config, n_layers)
        top = list(bert.encoder.layer)[len(bert.encoder.layer) - n_layers:]
        for ours, theirs in zip(branch.layers, top):
            attention = theirs.attention
            ours.self_attn.in_proj_weight.data.copy_(torch.cat(
                [attention.self.query.weight, attention.self.key.weight, attention.self.value.weight]))
            ours.self_attn.in_proj_bias.data.copy_(torch.cat(
                [attention.self.query.bias, attention.self.key.bias, attention.self.value.bias]))
            ours.self_attn.out_proj.load_state_dict(attention.output.dense.state_dict())
            ours.norm1.load_state_dict(attention.output.LayerNorm.state_dict())
            ours.linear1.load_state_dict(theirs.intermediate.dense.state_dict())
            ours.linear2.load_state_dict(theirs.output.dense.state_dict())
            ours.norm2.load_state_dict(theirs.output.LayerNorm.state_dict())
        return branch

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Token keep logits ``(batch, tokens)`` of trunk ``states`` ``(batch, tokens, hidden)``; ``mask`` is
        True on real tokens."""
        for layer in self.layers:
            states = layer(states, src_key_padding_mask=~mask)
        return self.classifier(states).squeeze(-1)


def sentence_logits(branch: KeepBranch, states: Sequence[torch.Tensor], sentence_of_token: Sequence[np.ndarray],
                    n_sentences: Sequence[int]) -> list[torch.Tensor]:
    """Per passage, each sentence's keep logit: the mean token logit over its tokens (``sentence_of_token``:
    the sentence index of each token, -1 outside every sentence); a sentence with no token (cut off by the
    window) gets -inf. One padded batch through the branch."""
    batch = nn.utils.rnn.pad_sequence([s.float() for s in states], batch_first=True)
    lengths = torch.tensor([len(s) for s in states])
    tokens = branch(batch, torch.arange(batch.shape[1]) < lengths[:, None])
    out = []
    for i, (index, n) in enumerate(zip(sentence_of_token, n_sentences)):
        index = torch.as_tensor(np.asarray(index), dtype=torch.long)
        inside = index >= 0
        sums = torch.zeros(n).index_add(0, index[inside], tokens[i, : len(index)][inside])
        counts = torch.zeros(n).index_add(0, index[inside], torch.ones(int(inside.sum())))
        out.append(torch.where(counts > 0, sums / counts.clamp(min=1), torch.full_like(sums, float("-inf"))))
    return out
