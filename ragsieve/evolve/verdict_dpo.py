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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ragsieve.models.verdict import VerdictScores, score_verdicts, tokenize_prompts, verdict_log_probs
from ragsieve.evolve.train import VerdictTrainer

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


class VerdictDPOTrainer(VerdictTrainer):
    """DPO with :func:`verdict_dpo_loss`; the reference is M_{t-1} (the adapter disabled).

    Example::

        trainer = VerdictDPOTrainer(ranker.llm, ranker.tokens, VerdictTrainConfig(beta=0.2))
        result = trainer.fit(prompts, labels, ref=ranker.verdicts_for_prompts(prompts))
        save_adapter(ranker.llm.model, "adapters/round-001"); merge_lora(ranker.llm)

    ``fit(prompts, labels, ref=None)``: ``labels[i]`` is the label whose word is chosen;
    ``ref`` holds reference verdict log-probs aligned with ``prompts`` (NaN rows, or no
    ``ref`` at all, are computed once here before training).
    """

    def prepare(self, model, prompts: Sequence[str], labels: Sequence[int], ref: VerdictScores | None) -> None:
        import torch

        n = len(prompts)
        logp_true = np.full(n, np.nan) if ref is None else np.asarray(ref.logp_true, dtype=np.float64).copy()
        logp_false = np.full(n, np.nan) if ref is None else np.asarray(ref.logp_false, dtype=np.float64).copy()
        missing = np.flatnonzero(~(np.isfinite(logp_true) & np.isfinite(logp_false)))
        if len(missing):
            with model.disable_adapter():  # fresh adapter disabled = M_{t-1}
                rows = tokenize_prompts(self.llm.tokenizer, [prompts[i] for i in missing])
                got = score_verdicts(model, self.tokens, rows, self.llm.tokenizer.pad_token_id, self.config.batch_size)
            logp_true[missing], logp_false[missing] = got.logp_true, got.logp_false
        self.ref_true = torch.tensor(logp_true, dtype=torch.float32)
        self.ref_false = torch.tensor(logp_false, dtype=torch.float32)
        self.last_rewards: list[float] = []

    def loss(self, model, batch, index, labels):
        policy_true, policy_false = verdict_log_probs(model, batch, self.tokens)
        policy_c, policy_r = chosen_rejected(policy_true, policy_false, labels)
        ref_c, ref_r = chosen_rejected(self.ref_true[index], self.ref_false[index], labels)
        out = verdict_dpo_loss(policy_c, policy_r, ref_c, ref_r, self.config.beta)
        self.last_rewards = (out.chosen_rewards - out.rejected_rewards).tolist()
        return out.loss
