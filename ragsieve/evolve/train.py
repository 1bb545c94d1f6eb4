"""Training a verdict model for one round: SFT on the verdict token, or DPO.

Every trainer attaches a fresh LoRA adapter to the current model (M_{t-1}), trains it,
and leaves ``llm.model`` as the PEFT model; :func:`train_round` then saves the adapter
(the round's delta) and merges it, so ``llm.model`` is M_t afterwards.

Objectives and backends, by name (:data:`TRAINERS`):

* ``sft``: cross-entropy of the label word's (first) token at the answer position.
* ``dpo-fast``: :class:`VerdictDPOTrainer` (loss in :mod:`ragsieve.evolve.verdict_dpo`), one forward per
  batch gives both the chosen and rejected log-probs; the default.
* ``dpo-trl``: TRL's ``DPOTrainer`` on the same single-token pairs (≈ 4× slower on CPU,
  kept as the reference implementation; see ``/work/shared/NOTES.md``).

Example::

    llm = load_local_llm()
    ranker = PointwiseLLMReranker("pubmedqa", llm)
    prompts = ranker.prompts(examples)
    train_round(llm, ranker.tokens, "sft", prompts, [x.label for x in examples],
                VerdictTrainConfig(lr=2e-4, epochs=2), save_dir="adapters/round-00")
"""

from __future__ import annotations

import logging
import math
import random
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.progress import report
from ragsieve.models.lora import LoraSettings, attach_lora, merge_lora, save_adapter
from ragsieve.models.training import TrainingCheckpoint, TrainResult
from ragsieve.evolve.verdict_dpo import chosen_rejected, verdict_dpo_loss
from ragsieve.models.verdict import (
    VerdictScores,
    VerdictTokens,
    answer_logits,
    left_pad_prompts,
    score_verdicts,
    tokenize_prompts,
    verdict_log_probs,
)

if TYPE_CHECKING:
    import torch

    from ragsieve.models.llm import LocalLLM

log = logging.getLogger(__name__)


class VerdictTrainConfig(StrictConfig):
    """One round of adapter training (β = 0.2 and LoRA r16 from the paper)."""

    lr: float = 1e-4
    epochs: int = 1
    batch_size: int = 8
    beta: float = 0.2  # DPO temperature
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    lora: LoraSettings = LoraSettings()
    dpo_backend: Literal["fast", "trl"] = "fast"
    seed: int = 0


class VerdictTrainer(ABC):
    """Base: a seeded loop of AdamW steps over shuffled batches of (prompt, label)."""

    def __init__(self, llm: "LocalLLM", tokens: VerdictTokens, config: VerdictTrainConfig):
        self.llm = llm
        self.tokens = tokens
        self.config = config

    def fit(self, prompts: Sequence[str], labels: Sequence[int], ref: VerdictScores | None = None, *,
            checkpoint: "TrainingCheckpoint | None" = None,
            on_epoch_end: Callable[[int, TrainResult], None] | None = None) -> TrainResult:
        """Attach a fresh adapter and train it; ``ref`` (aligned with prompts) is for DPO.

        With ``checkpoint``, the adapter, optimizer and step are saved every
        ``checkpoint.every`` steps, and a run killed mid-training continues from the last
        save (the batch order is replayed from the seed, so the result is the one an
        uninterrupted run gives).

        ``on_epoch_end(epoch, result)`` is called with ``self.llm.model`` (base + the adapter so far)
        in eval mode after each epoch (1-based; ``result`` holds the losses so far). The learning rate is constant and each epoch's
        order is drawn in sequence, so after epoch k the model is the one an ``epochs = k``
        training ends with: one run of E epochs scores every epoch count up to E. With a
        checkpoint it is saved right after the call, so a kill during the call repeats it;
        epochs that ended before a resumed run's start are not called again.
        """
        import torch

        if len(prompts) != len(labels):
            raise RagsieveError(f"{len(prompts)} prompts but {len(labels)} labels")
        result = TrainResult(examples=len(prompts))
        if not prompts:
            return result
        start = time.perf_counter()
        model = attach_lora(self.llm, self.config.lora, self.config.seed)
        self.prepare(model, prompts, labels, ref)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=self.config.lr, weight_decay=self.config.weight_decay)
        resume_at = 0
        if checkpoint is not None:
            checkpoint.bind(self.config, prompts, labels)
            resume_at = checkpoint.restore(model, optimizer, result)
        prior_seconds = result.seconds  # a resumed run's time includes the killed run's
        rng = random.Random(self.config.seed)
        total_steps = self.config.epochs * -(-len(prompts) // self.config.batch_size)
        step = 0

        def save() -> None:
            result.seconds = prior_seconds + time.perf_counter() - start
            checkpoint.save(model, optimizer, result)

        for epoch in range(1, self.config.epochs + 1):
            order = list(range(len(prompts)))
            rng.shuffle(order)  # drawn for every epoch, resumed or not, so the order is the same
            for lo in range(0, len(order), self.config.batch_size):
                step += 1
                if step <= resume_at:
                    continue
                idx = order[lo : lo + self.config.batch_size]
                batch = left_pad_prompts(self.llm.tokenizer, [prompts[i] for i in idx])
                loss = self.loss(model, batch, idx, [int(labels[i]) for i in idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if self.config.max_grad_norm:
                    torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
                optimizer.step()
                result.losses.append(float(loss.detach()))
                result.steps += 1
                report("train", result.steps, total_steps)
                epoch_done = lo + self.config.batch_size >= len(order)
                if (checkpoint is not None and step % checkpoint.every == 0 and step < total_steps
                        and not (epoch_done and on_epoch_end is not None)):  # saved after the hook instead
                    save()
            if on_epoch_end is not None and step > resume_at:
                model.eval()
                on_epoch_end(epoch, result)
                model.train()
                if checkpoint is not None and step < total_steps:
                    save()
        model.eval()
        result.seconds = prior_seconds + time.perf_counter() - start
        return result

    def prepare(self, model, prompts: Sequence[str], labels: Sequence[int], ref: VerdictScores | None) -> None:
        """Hook run once before the first step (DPO caches reference log-probs here)."""

    @abstractmethod
    def loss(self, model, batch, index: list[int], labels: list[int]) -> "torch.Tensor": ...


class VerdictSFTTrainer(VerdictTrainer):
    """Cross-entropy of the label word's token at the answer position (full vocabulary).

    Example::

        VerdictSFTTrainer(llm, ranker.tokens, VerdictTrainConfig(lr=2e-4)).fit(prompts, labels)
    """

    def loss(self, model, batch, index, labels):
        import torch
        import torch.nn.functional as F

        targets = torch.tensor([self.tokens.id_for(y) for y in labels])
        return F.cross_entropy(answer_logits(model, batch), targets)


class TRLVerdictDPOTrainer(VerdictTrainer):
    """TRL ``DPOTrainer`` (sigmoid loss) on single-token completions: chosen = the correct
    label word's token, rejected = the other one, no EOS appended.

    TRL's own preprocessing appends EOS to every completion, which would add a
    log P(EOS | word) term to both sides; the subclass from :func:`single_token_dpo_trainer_class`
    feeds pre-tokenised ``prompt_ids`` / ``chosen_ids`` / ``rejected_ids`` instead, so this
    backend optimises exactly the objective of the fast one. With ``peft_config`` and no
    ``ref_model``, TRL's reference is the adapter-disabled model, which here is M_{t-1}.
    ``ref`` is ignored: TRL precomputes its own (``precompute_ref_log_probs=True``).

    Example::

        TRLVerdictDPOTrainer(llm, ranker.tokens, VerdictTrainConfig(dpo_backend="trl")).fit(prompts, labels)
    """

    def fit(self, prompts, labels, ref=None, *, checkpoint=None, on_epoch_end=None):
        import torch

        if on_epoch_end is not None:
            raise RagsieveError("the TRL DPO backend has no per-epoch hook; use dpo_backend: fast")
        if checkpoint is not None:
            log.warning("the TRL DPO backend is not checkpointed; a killed round restarts from its first step")
        result = TrainResult(examples=len(prompts))
        if not prompts:
            return result
        start = time.perf_counter()
        torch.manual_seed(self.config.seed)
        with tempfile.TemporaryDirectory(prefix="trl-dpo-") as tmp:
            trainer = build_trl_dpo_trainer(self.llm, self.tokens, prompts, labels, self.config, tmp)
            trainer.train()
        self.llm.model = trainer.model.eval()
        result.losses = [float(h["loss"]) for h in trainer.state.log_history if "loss" in h]
        result.steps = int(trainer.state.global_step)
        result.seconds = time.perf_counter() - start
        return result

    def loss(self, model, batch, index, labels):  # pragma: no cover - TRL computes its own
        raise NotImplementedError


def single_token_dpo_trainer_class():
    """A ``DPOTrainer`` subclass whose dataset is already tokenised (no EOS appended)."""
    from trl import DPOTrainer

    class SingleTokenDPOTrainer(DPOTrainer):
        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset

    return SingleTokenDPOTrainer


def single_token_rows(tokenizer, tokens: VerdictTokens, prompts: Sequence[str], labels: Sequence[int]) -> list[dict]:
    """TRL's tokenised preference rows for verdict pairs."""
    rows = []
    for prompt, label in zip(prompts, labels):
        rows.append({
            "prompt_ids": tokenizer(prompt, add_special_tokens=False)["input_ids"],
            "chosen_ids": [tokens.id_for(int(label))],
            "rejected_ids": [tokens.id_for(1 - int(label))],
        })
    return rows


def build_trl_dpo_trainer(llm: "LocalLLM", tokens: VerdictTokens, prompts, labels, config: VerdictTrainConfig, output_dir):
    """The configured TRL trainer (CPU settings from NOTES: fp32, no checkpointing, precomputed ref)."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import DPOConfig

    args = DPOConfig(
        output_dir=str(output_dir),
        learning_rate=config.lr,
        beta=config.beta,
        loss_type=["sigmoid"],
        num_train_epochs=config.epochs,
        per_device_train_batch_size=config.batch_size,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        lr_scheduler_type="constant",
        warmup_steps=0,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        precompute_ref_log_probs=True,
        max_length=None,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=config.seed,
        data_seed=config.seed,
        dataloader_drop_last=False,
        disable_tqdm=True,
    )
    dataset = Dataset.from_list(single_token_rows(llm.tokenizer, tokens, prompts, labels))
    trainer_cls = single_token_dpo_trainer_class()
    trainer = trainer_cls(
        model=llm.model, args=args, processing_class=llm.tokenizer, train_dataset=dataset,
        peft_config=config.lora.peft_config(),
    )
    trainer.remove_callback(PrinterCallback)  # with tqdm off it prints every log dict to stdout
    return trainer


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


#: objective name → its trainer
TRAINERS: dict[str, type[VerdictTrainer]] = {
    "sft": VerdictSFTTrainer,
    "dpo-fast": VerdictDPOTrainer,
    "dpo-trl": TRLVerdictDPOTrainer,
}


def trainer_class(objective: str, config: VerdictTrainConfig) -> type[VerdictTrainer]:
    """``sft`` or ``dpo`` (its backend from ``config.dpo_backend``)."""
    name = f"dpo-{config.dpo_backend}" if objective == "dpo" else objective
    try:
        return TRAINERS[name]
    except KeyError:
        raise RagsieveError(f"unknown training objective '{objective}'; known: sft, dpo") from None


def train_round(
    llm: "LocalLLM",
    tokens: VerdictTokens,
    objective: str,
    prompts: Sequence[str],
    labels: Sequence[int],
    config: VerdictTrainConfig,
    *,
    ref: VerdictScores | None = None,
    save_dir: str | Path | None = None,
    checkpoint: TrainingCheckpoint | None = None,
    on_epoch_end: Callable[[int, TrainResult], None] | None = None,
) -> TrainResult:
    """Train one round's delta, save it (atomically) to ``save_dir``, and merge it in.

    ``checkpoint``: resume a training killed part-way (see :class:`TrainingCheckpoint`);
    cleared once the delta is saved. ``on_epoch_end``: see :meth:`VerdictTrainer.fit`.
    """
    trainer = trainer_class(objective, config)(llm, tokens, config)
    result = trainer.fit(prompts, labels, ref=ref, checkpoint=checkpoint, on_epoch_end=on_epoch_end)
    if result.steps and save_dir is not None:
        save_adapter(llm.model, save_dir)
    if checkpoint is not None:
        checkpoint.clear()
    merge_lora(llm)
    if result.losses and not all(math.isfinite(x) for x in result.losses):
        raise RagsieveError(f"{objective} training diverged (non-finite loss); lower the learning rate")
    return result


def nan_scores(n: int) -> VerdictScores:
    """Reference placeholders: rows left NaN are computed by the DPO trainer."""
    return VerdictScores(np.full(n, np.nan), np.full(n, np.nan))
