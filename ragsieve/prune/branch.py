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

    def as_bert(self, config) -> BertBranch:
        """This branch (its weights now) as transformers' BERT layers, for inference under bf16 autocast: there
        they run at the reranker's own speed, ≈ 1.4× PyTorch's fused encoder-layer kernel, which keeps fp32
        matrix products. ``config``: the cross-encoder's (its attention implementation is used)."""
        return BertBranch.from_keep_branch(self, config)


class BertBranch(nn.Module):
    """A :class:`KeepBranch`'s layers as ``BertLayer`` s and its classifier: the same function (the layer
    computations are equal), read-only."""

    def __init__(self, layers: nn.ModuleList, classifier: nn.Linear):
        super().__init__()
        self.layers, self.classifier = layers, classifier

    @classmethod
    def from_keep_branch(cls, branch: KeepBranch, config) -> BertBranch:
        import copy

        from transformers.models.bert.modeling_bert import BertLayer

        layers = nn.ModuleList()
        for ours in branch.layers:
            theirs = BertLayer(config)
            attention = theirs.attention
            for target, weight, bias in zip((attention.self.query, attention.self.key, attention.self.value),
                                            ours.self_attn.in_proj_weight.chunk(3),
                                            ours.self_attn.in_proj_bias.chunk(3)):
                target.weight.data.copy_(weight)
                target.bias.data.copy_(bias)
            attention.output.dense.load_state_dict(ours.self_attn.out_proj.state_dict())
            attention.output.LayerNorm.load_state_dict(ours.norm1.state_dict())
            theirs.intermediate.dense.load_state_dict(ours.linear1.state_dict())
            theirs.output.dense.load_state_dict(ours.linear2.state_dict())
            theirs.output.LayerNorm.load_state_dict(ours.norm2.state_dict())
            layers.append(theirs)
        return cls(layers, copy.deepcopy(branch.classifier)).eval()

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attend = mask[:, None, None, :]  # a boolean mask: SDPA's fused kernel, not an additive float one
        for layer in self.layers:
            out = layer(states, attention_mask=attend)
            states = out[0] if isinstance(out, tuple) else out
        return self.classifier(states).squeeze(-1)


def sentence_logits(branch: KeepBranch | BertBranch, states: Sequence[torch.Tensor],
                    sentence_of_token: Sequence[np.ndarray],
                    n_sentences: Sequence[int]) -> list[torch.Tensor]:
    """Per passage, each sentence's keep logit: the mean token logit over its tokens (``sentence_of_token``:
    the sentence index of each token, -1 outside every sentence); a sentence with no token (cut off by the
    window) gets -inf. One padded batch through the branch."""
    batch = nn.utils.rnn.pad_sequence([s.float() for s in states], batch_first=True)
    lengths = torch.tensor([len(s) for s in states])
    tokens = branch(batch, torch.arange(batch.shape[1]) < lengths[:, None]).float()  # bf16 under autocast
    out = []
    for i, (index, n) in enumerate(zip(sentence_of_token, n_sentences)):
        index = torch.as_tensor(np.asarray(index), dtype=torch.long)
        inside = index >= 0
        sums = torch.zeros(n).index_add(0, index[inside], tokens[i, : len(index)][inside])
        counts = torch.zeros(n).index_add(0, index[inside], torch.ones(int(inside.sum())))
        out.append(torch.where(counts > 0, sums / counts.clamp(min=1), torch.full_like(sums, float("-inf"))))
    return out
