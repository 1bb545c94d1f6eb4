"""What a training run did, in one shape for every trainer (graders, verdict SFT / DPO),
and the resumable checkpoint of a hand-written training loop."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragsieve.atomic import atomic_file
from ragsieve.errors import RagsieveError


@dataclass
class TrainResult:
    """Steps, examples (after any resampling), time and per-step losses; ``summary()`` goes into metrics.

    Example::

        >>> r = TrainResult(steps=2, examples=16, seconds=4.0, losses=[0.9, 0.5])
        >>> r.summary()["seconds_per_step"], r.first_loss
        (2.0, 0.9)
    """

    steps: int = 0
    examples: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    positives: int | None = None
    negatives: int | None = None
    truncated_passages: int | None = None  # None: the trainer got rendered prompts and could not count

    @property
    def first_loss(self) -> float | None:
        return self.losses[0] if self.losses else None

    @property
    def final_loss(self) -> float | None:
        """Mean over the last tenth of the steps (single steps are noisy)."""
        if not self.losses:
            return None
        tail = self.losses[-max(1, len(self.losses) // 10) :]
        return float(np.mean(tail))

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / self.steps if self.steps else 0.0

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "losses"}
        out.update(first_loss=self.first_loss, final_loss=self.final_loss, seconds_per_step=self.seconds_per_step)
        return out


class TrainingCheckpoint:
    """Trainable weights, optimizer state, step and losses of one training, saved every
    ``every`` steps to ``folder/state.pt`` (atomically, so a ``kill -9`` leaves the last
    complete save) and restored by the next run of the same training.

    A checkpoint belongs to one training: :meth:`bind` keys it by the settings and the data,
    and a checkpoint made from anything else is discarded rather than resumed. The caller
    gives each training its own folder and calls :meth:`clear` once the result is saved.
    Only trainable parameters are stored (a LoRA adapter: megabytes, not the model).

    Example::

        ckpt = TrainingCheckpoint("work/m0.checkpoint", every=25, tag=start_model_fingerprint)
        trainer.fit(prompts, labels, checkpoint=ckpt)   # a rerun after a kill resumes
        save_adapter(llm.model, "work/m0"); ckpt.clear()
    """

    def __init__(self, folder: str | Path, every: int, tag: str = ""):
        if every < 1:
            raise RagsieveError(f"checkpoint interval must be >= 1 step, got {every}")
        self.folder = Path(folder)
        self.every = int(every)
        self.tag = tag  # what the settings and data do not show, e.g. the start model's fingerprint
        self.key: str | None = None

    @property
    def path(self) -> Path:
        return self.folder / "state.pt"

    def bind(self, config: Any, inputs: Sequence[Any], labels: Sequence[Any]) -> str:
        """Key the checkpoint by the training settings and data (pydantic config or dict)."""
        settings = config.model_dump() if hasattr(config, "model_dump") else config
        digest = hashlib.sha256(json.dumps([self.tag, settings], sort_keys=True, default=str).encode())
        for x, y in zip(inputs, labels):
            digest.update(json.dumps([x, y], default=str).encode())
        self.key = digest.hexdigest()[:20]
        return self.key

    def restore(self, model, optimizer, result: TrainResult) -> int:
        """Load a matching checkpoint into ``model`` / ``optimizer`` / ``result``; the steps done (0 if none)."""
        import torch

        if not self.path.is_file():
            return 0
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception:  # unreadable (an older format): start over rather than fail the run
            self.clear()
            return 0
        if state.get("key") != self.key:  # another training's checkpoint: never resume it
            self.clear()
            return 0
        trainable = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in state["params"].items():
                trainable[name].copy_(value)
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        result.steps, result.losses = int(state["steps"]), list(state["losses"])
        result.seconds += float(state.get("seconds", 0.0))
        return result.steps

    def save(self, model, optimizer, result: TrainResult) -> None:
        import torch

        state = {
            "key": self.key, "steps": result.steps, "losses": list(result.losses), "seconds": result.seconds,
            "params": {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad},
            "optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
        }
        with atomic_file(self.path) as tmp:
            torch.save(state, tmp)

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
