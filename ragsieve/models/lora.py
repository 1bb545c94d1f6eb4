"""LoRA adapters as round deltas: attach on the current weights, save, merge.

Round t trains a fresh LoRA adapter on top of M_{t-1} (the base with Δ0 … Δ_{t-1}
merged in), so "the adapter disabled" is exactly the previous round's model: DPO's
reference needs no second copy of the network, and TRL's ``DPOTrainer`` (which uses
the adapter-disabled model as reference) gets the right one too. M_t is rebuilt from
the base by merging the saved deltas in order.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Union

from ragsieve.artifacts import check_model_folder
from ragsieve.atomic import atomic_directory
from ragsieve.config import StrictConfig
from ragsieve.errors import ModelNotAvailable

if TYPE_CHECKING:
    from ragsieve.models.llm import LocalLLM


class LoraSettings(StrictConfig):
    """PEFT LoRA on all linear layers; dropout 0 keeps policy and reference forwards identical."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: Union[str, list[str]] = "all-linear"

    def peft_config(self):
        from peft import LoraConfig

        return LoraConfig(
            r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=self.target_modules,
            task_type="CAUSAL_LM",
        )


def is_peft(model) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def attach_lora(llm: "LocalLLM", settings: LoraSettings, seed: int = 0):
    """Wrap ``llm.model`` in a fresh trainable adapter (B = 0, so it starts as M_{t-1})."""
    import torch
    from peft import get_peft_model

    if is_peft(llm.model):
        raise ModelNotAvailable("the model already carries an adapter; merge it first (merge_lora)")
    torch.manual_seed(seed)  # LoRA A is randomly initialised
    llm.model = get_peft_model(llm.model, settings.peft_config())
    return llm.model


def merge_lora(llm: "LocalLLM") -> None:
    """Fold the current adapter into the weights: ``llm.model`` becomes M_t."""
    if is_peft(llm.model):
        llm.model = llm.model.merge_and_unload().eval()


def save_adapter(peft_model, path: str | Path) -> Path:
    """Write the adapter folder atomically (temp dir + rename), replacing an older one."""
    path = Path(path)
    # an existing folder is a leftover of an interrupted run: same round, about to be replaced
    with atomic_directory(path, overwrite=True) as tmp:
        peft_model.save_pretrained(str(tmp))
    return path


def merge_adapter(llm: "LocalLLM", path: str | Path) -> None:
    """Load a saved delta onto ``llm.model`` and merge it in."""
    from peft import PeftModel

    path = Path(path)
    if not (path / "adapter_config.json").is_file():
        raise ModelNotAvailable(f"no LoRA adapter at {path} (adapter_config.json missing)")
    # a round's delta cannot be recomputed alone: later rounds were trained on top of it
    check_model_folder(path, "restore the store from a backup, or start a new one (`ragsieve evolve init`)")
    merge_lora(llm)
    llm.model = PeftModel.from_pretrained(llm.model, str(path)).merge_and_unload().eval()
