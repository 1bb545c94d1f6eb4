"""What a training run did, in one shape for every trainer (graders, verdict SFT / DPO)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


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
    truncated_passages: int = 0

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
