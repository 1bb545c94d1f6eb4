"""Where the decoder blocks of an HF causal LM are, and how to read a layer's last position.

Shared by generation (which captures a layer's state during prefill) and the probe's
early-exit extractor, so both read exactly the same tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragsieve.errors import RagsieveError

if TYPE_CHECKING:
    import torch


def decoder_layers(model) -> "torch.nn.ModuleList":
    """The decoder block list of an HF causal LM (Llama, Qwen, Mistral, Gemma, GPT-2, ...)."""
    base = getattr(model, "base_model", model)
    for owner in (base, getattr(base, "model", None), getattr(model, "model", None)):
        if owner is None:
            continue
        for name in ("layers", "h", "blocks"):
            layers = getattr(owner, name, None)
            if layers is not None and hasattr(layers, "__len__"):
                return layers
    raise RagsieveError(f"cannot find decoder layers in {type(model).__name__}; early exit needs model.model.layers")


def last_position(layer_output) -> "torch.Tensor":
    """Last-position state from a decoder layer's forward output (a tensor or a tuple)."""
    hidden = layer_output[0] if isinstance(layer_output, tuple) else layer_output
    return hidden[:, -1, :].float().cpu()
