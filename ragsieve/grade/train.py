"""Training graders: one HF ``Trainer`` subclass, the lightweight-grader paper's schedule.

AdamW with a cosine schedule from the peak learning rate (2e-5 by default) down to 10 %
of it, optional over-/under-sampling of the minority label, and a loss chosen by name
(:data:`ragsieve.grade.losses.LOSSES`). The grader supplies the logits (next-token
logits, classification logits or a linear head over cached states); the trainer only
computes the loss, so every kind shares the optimiser, schedule and sampling.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Sequence

import numpy as np

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.models.training import TrainResult  # noqa: F401 - re-exported for graders

if TYPE_CHECKING:
    from torch import nn

#: ``progress(step, total_steps, loss)`` after every optimiser step
ProgressFn = Callable[[int, int, float], None]


class GraderTrainConfig(StrictConfig):
    """Optimiser, schedule, sampling and loss for one grader training run.

    ``max_steps > 0`` caps the run (the cosine schedule then spans exactly those steps),
    which is how configs are kept inside a time budget on a CPU.
    """

    lr: float = 2e-5
    min_lr_ratio: float = 0.1  # the cosine schedule ends at lr * min_lr_ratio
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    epochs: float = 1.0
    max_steps: int = 0
    batch_size: int = 8
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    loss: Literal["cross_entropy", "contrastive"] = "cross_entropy"
    margin: float = 1.0  # contrastive loss only
    sampling: Literal["none", "oversample", "undersample"] = "none"
    seed: int = 0


# -- sampling switches ---------------------------------------------------------------


def _keep_all(pos: np.ndarray, neg: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([pos, neg])


def _oversample(pos: np.ndarray, neg: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Every example, plus the minority label redrawn (with replacement) up to the majority's size."""
    small, big = (pos, neg) if len(pos) < len(neg) else (neg, pos)
    extra = rng.choice(small, len(big) - len(small), replace=True) if len(small) else small
    return np.concatenate([big, small, extra])


def _undersample(pos: np.ndarray, neg: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Every minority example and as many majority examples, drawn without replacement."""
    small, big = (pos, neg) if len(pos) < len(neg) else (neg, pos)
    return np.concatenate([small, rng.choice(big, len(small), replace=False)])


SAMPLERS: dict[str, Callable[[np.ndarray, np.ndarray, np.random.Generator], np.ndarray]] = {
    "none": _keep_all,
    "oversample": _oversample,
    "undersample": _undersample,
}


def resample_indices(labels: Sequence[int], sampling: str = "none", seed: int = 0) -> np.ndarray:
    """Indices into ``labels`` to train on, sorted: all, minority over-sampled, or majority under-sampled.

    >>> resample_indices([1, 0, 0, 0], "oversample").tolist()
    [0, 0, 0, 1, 2, 3]
    >>> resample_indices([1, 0, 0, 0], "undersample", seed=0).shape
    (2,)
    """
    try:
        sampler = SAMPLERS[sampling]
    except KeyError:
        raise RagsieveError(f"unknown sampling '{sampling}'; use one of {', '.join(SAMPLERS)}") from None
    y = np.asarray(labels, dtype=np.int64)
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    if len(pos) == 0 or len(neg) == 0:
        raise RagsieveError(f"training needs both labels ({len(pos)} relevant, {len(neg)} not relevant)")
    return np.sort(sampler(pos, neg, np.random.default_rng(seed)))


def make_loss(config: GraderTrainConfig) -> "nn.Module":
    from ragsieve.grade.losses import LOSSES

    return LOSSES[config.loss].from_options(config)


# -- the trainer -------------------------------------------------------------------------

#: ``logits_fn(model, inputs, labels) -> (logits, targets)``: tensors for the loss
LogitsFn = Callable[["nn.Module", dict[str, Any], Any], tuple[Any, Any]]


def _trainer_class():
    """Built on first use so importing this module does not import transformers."""
    from transformers import Trainer

    class GraderTrainer(Trainer):
        """``Trainer`` whose loss is ``loss_fn(*logits_fn(model, inputs, labels))``."""

        def __init__(self, *args: Any, logits_fn: LogitsFn, loss_fn: "nn.Module", **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.logits_fn = logits_fn
            self.loss_fn = loss_fn

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs = dict(inputs)
            labels = inputs.pop("labels")
            logits, targets = self.logits_fn(model, inputs, labels)
            loss = self.loss_fn(logits, targets)
            return (loss, {"logits": logits}) if return_outputs else loss

    return GraderTrainer


def run_trainer(
    model: "nn.Module",
    examples: list[dict[str, Any]],
    collate: Callable[[list[dict[str, Any]]], dict[str, Any]],
    logits_fn: LogitsFn,
    config: GraderTrainConfig,
    progress: ProgressFn | None = None,
    loss_fn: "nn.Module | None" = None,
) -> tuple[int, list[float], float]:
    """Train ``model`` in place on ``examples``; returns (steps, per-step losses, seconds).

    ``loss_fn`` defaults to the loss ``config`` names.
    """
    from transformers import PrinterCallback, TrainerCallback, TrainingArguments

    losses: list[float] = []

    class _Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))
                if progress:
                    progress(state.global_step, state.max_steps, float(logs["loss"]))

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ragsieve-grader-") as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=config.batch_size,
            gradient_accumulation_steps=config.grad_accum,
            learning_rate=config.lr,
            weight_decay=config.weight_decay,
            num_train_epochs=config.epochs,
            max_steps=config.max_steps if config.max_steps > 0 else -1,
            lr_scheduler_type="cosine_with_min_lr",
            lr_scheduler_kwargs={"min_lr_rate": config.min_lr_ratio},
            warmup_steps=config.warmup_ratio,  # a float below 1 is a ratio of the total steps
            max_grad_norm=config.max_grad_norm,
            optim="adamw_torch",
            logging_steps=1,  # one loss per step: the history is the training curve
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            remove_unused_columns=False,  # our collator builds exactly what logits_fn reads
            dataloader_pin_memory=False,
            seed=config.seed,
        )
        trainer = _trainer_class()(
            model=model, args=args, train_dataset=examples, data_collator=collate,
            logits_fn=logits_fn, loss_fn=loss_fn or make_loss(config), callbacks=[_Record()],
        )
        trainer.remove_callback(PrinterCallback)  # losses go to `progress`, not stdout
        trainer.train()
        steps = int(trainer.state.global_step)
    model.eval()
    return steps, losses, time.perf_counter() - start
