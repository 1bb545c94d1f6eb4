"""DPO for single-token verdicts: one forward of the prompt scores chosen AND rejected.

A verdict pair is (prompt, chosen = the correct label word, rejected = the other one).
Both completions are one token at the same position after the same prompt, so the
sequence log-probabilities DPO needs are two entries of one log-softmax:

    log π(chosen | x) = log_softmax(logits_x)[chosen_id]
    log π(rejected | x) = log_softmax(logits_x)[rejected_id]

TRL's ``DPOTrainer`` instead runs the policy over prompt+chosen and prompt+rejected
separately (two sequences per pair) and computes the output layer at every position.
Here a batch of B pairs costs one forward of B prompts with the output layer at the last
position only. The reference log-probs (the previous round's model = this round's model
with its fresh adapter disabled) are computed once per round, before the first step, and
cached; rows the caller already has (e.g. from evaluating M_{t-1} on the round's batch)
are reused. The loss is TRL's sigmoid DPO loss (tested equal on the same batch):

    L = -log σ(β · [(log π_c - log π_ref,c) - (log π_r - log π_ref,r)])

Example (the loss alone)::

    >>> import torch
    >>> out = verdict_dpo_loss(torch.tensor([-0.1]), torch.tensor([-2.3]),
    ...                        torch.tensor([-0.7]), torch.tensor([-0.7]), beta=0.2)
    >>> round(float(out.loss), 4), round(float(out.chosen_rewards[0]), 2), round(float(out.rejected_rewards[0]), 2)
    (0.4972, 0.12, -0.32)

Example (a round of training)::

    ranker = PointwiseLLMReranker("fever", load_local_llm())
    prompts = ranker.prompts(examples)
    ref = ranker.verdicts_for_prompts(prompts)          # M_{t-1}'s verdicts double as the reference
    VerdictDPOTrainer(ranker.llm, ranker.tokens, VerdictTrainConfig()).fit(prompts, labels, ref=ref)

The trainer, :class:`~ragsieve.evolve.train.VerdictDPOTrainer`, lives with the other trainers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np


if TYPE_CHECKING:
    import torch


@dataclass
class VerdictDPOOutput:
    loss: "torch.Tensor"  # mean over the batch
    losses: "torch.Tensor"  # per pair
    chosen_rewards: "torch.Tensor"  # β (log π_c - log π_ref,c), detached
    rejected_rewards: "torch.Tensor"


def verdict_dpo_loss(
    policy_chosen_logps: "torch.Tensor",
    policy_rejected_logps: "torch.Tensor",
    ref_chosen_logps: "torch.Tensor",
    ref_rejected_logps: "torch.Tensor",
    beta: float = 0.2,
) -> VerdictDPOOutput:
    """Sigmoid DPO loss (Rafailov et al. 2023) from per-pair completion log-probs."""
    import torch.nn.functional as F

    chosen_logratios = policy_chosen_logps - ref_chosen_logps
    rejected_logratios = policy_rejected_logps - ref_rejected_logps
    losses = -F.logsigmoid(beta * (chosen_logratios - rejected_logratios))
    return VerdictDPOOutput(
        loss=losses.mean(),
        losses=losses,
        chosen_rewards=(beta * chosen_logratios).detach(),
        rejected_rewards=(beta * rejected_logratios).detach(),
    )


def chosen_rejected(logp_true, logp_false, labels):
    """Reorder (true, false) log-probs into (chosen, rejected) by each pair's correct label."""
    import torch

    is_true = torch.as_tensor(np.asarray(labels, dtype=bool))
    return torch.where(is_true, logp_true, logp_false), torch.where(is_true, logp_false, logp_true)
