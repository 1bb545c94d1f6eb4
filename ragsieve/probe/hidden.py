"""Pre-token hidden states: the layer-ℓ state at the last prompt position.

That position is where the first answer token is generated from, so its state tells
what the LLM "knows" before it answers (the knowledge-boundary probe reads it).

The forward pass stops after decoder layer ℓ (a hook raises once that layer has
run), so reading the middle layer costs about half a forward. Batches are left
padded and get position ids from the attention mask, exactly as ``generate`` does,
so a padded row gives the same state as the prompt alone.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ragsieve.errors import RagsieveError
from ragsieve.models.layers import decoder_layers, last_position
from ragsieve.progress import report

if TYPE_CHECKING:
    import torch

    from ragsieve.models.llm import LocalLLM
    from ragsieve.probe.cache import StateCache

log = logging.getLogger(__name__)


class _StopForward(Exception):
    """Raised from the layer hook to skip the rest of the network."""


def resolve_layer(layer: int | float, num_layers: int) -> int:
    """Map a layer spec to a hidden-state index in ``[1, num_layers]``.

    An int is an index into HF ``hidden_states`` (1 = output of the first decoder
    layer; negative counts from the end); a float in (0, 1) is a fraction of depth
    (0.5 → L/2, the paper's middle layer).

    Example::

        resolve_layer(0.5, 30)  # 15
    """
    if isinstance(layer, float) and not layer.is_integer():
        if not 0.0 < layer < 1.0:
            raise RagsieveError(f"layer fraction must be in (0, 1), got {layer}")
        index = max(1, round(layer * num_layers))
    else:
        index = int(layer)
        if index < 0:
            index = num_layers + 1 + index
    if not 1 <= index <= num_layers:
        raise RagsieveError(f"layer {layer} out of range for a {num_layers}-layer model (1..{num_layers})")
    return index


def prompt_key(model_spec: str, layer: int, prompt: str) -> str:
    return hashlib.sha1(f"{model_spec}\x00{layer}\x00{prompt}".encode()).hexdigest()


class HiddenStateExtractor:
    """Batched early-exit extraction of pre-token hidden states.

    Example::

        extractor = HiddenStateExtractor(load_local_llm(), layer=0.5)
        states = extractor.extract([llm.format_prompt("who wrote hamlet?")])  # (1, 576)
    """

    def __init__(
        self,
        llm: "LocalLLM",
        layer: int | float = 0.5,
        *,
        batch_size: int = 16,
        max_length: int | None = None,
        cache: "StateCache | None" = None,
    ):
        self.llm = llm
        self.layer = resolve_layer(layer, llm.num_layers)
        self.batch_size = batch_size
        self.max_length = max_length or llm.context_length
        self.cache = cache
        self.layers = decoder_layers(llm.model)

    @property
    def dim(self) -> int:
        return self.llm.hidden_size

    def _forward_batch(self, prompts: Sequence[str], layers: Sequence[int] | None = None) -> np.ndarray | dict[int, np.ndarray]:
        """States of ``self.layer`` (or of each of ``layers``: one forward, stopped after the deepest)."""
        import torch

        tok = self.llm.tokenizer
        enc = tok(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
        if enc["input_ids"].shape[1] > self.max_length:
            raise RagsieveError(
                f"prompt of {enc['input_ids'].shape[1]} tokens exceeds max_length={self.max_length}; "
                "build prompts with a token budget (PromptBuilder) first"
            )
        mask = enc["attention_mask"]
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # what generate() uses with left padding
        wanted = sorted(set(layers)) if layers is not None else [self.layer]
        captured: dict[int, torch.Tensor] = {}

        def hook_for(layer: int):
            def hook(_module, _inputs, output):
                captured[layer] = last_position(output)
                if layer == wanted[-1]:  # nothing deeper is read: stop the forward here
                    raise _StopForward

            return hook

        handles = [self.layers[layer - 1].register_forward_hook(hook_for(layer)) for layer in wanted]
        try:
            with torch.inference_mode():
                self.llm.model(
                    input_ids=enc["input_ids"].to(self.llm.device),
                    attention_mask=mask.to(self.llm.device),
                    position_ids=position_ids.to(self.llm.device),
                    use_cache=False,
                )
        except _StopForward:
            pass
        finally:
            for handle in handles:
                handle.remove()
        missing = [layer for layer in wanted if layer not in captured]
        if missing:
            raise RagsieveError(f"layer(s) {missing} did not run; is the model's layer list {type(self.layers)}?")
        if layers is None:
            return captured[self.layer].numpy()
        return {layer: captured[layer].numpy() for layer in wanted}

    def extract(self, prompts: Sequence[str]) -> np.ndarray:
        """States for already formatted prompts, shape ``(len(prompts), hidden_size)``, float32."""
        out = np.zeros((len(prompts), self.dim), dtype=np.float32)
        todo: list[int] = []
        keys = [prompt_key(self.llm.spec, self.layer, p) for p in prompts] if self.cache is not None else []
        if self.cache is not None:
            found = self.cache.get_many(keys)
            for i, key in enumerate(keys):
                if key in found:
                    out[i] = found[key]
                else:
                    todo.append(i)
        else:
            todo = list(range(len(prompts)))
        # Sorting by length keeps padding (wasted compute) low within each batch.
        todo.sort(key=lambda i: len(prompts[i]))
        for lo in range(0, len(todo), self.batch_size):
            idx = todo[lo : lo + self.batch_size]
            states = self._forward_batch([prompts[i] for i in idx])
            out[idx] = states
            if self.cache is not None:
                self.cache.put_many({keys[i]: states[j] for j, i in enumerate(idx)})
        return out


def extract_layers(
    extractor: HiddenStateExtractor, prompts: Sequence[str], layers: Sequence[int | float]
) -> dict[int, np.ndarray]:
    """States of several layers from one early-exit forward per batch (the layer sweep's input).

    Cached states (same LLM, layer, prompt) are reused; a batch is recomputed only for
    prompts missing some layer. Equals :meth:`HiddenStateExtractor.extract` per layer (tested).

    Example::

        by_layer = extract_layers(HiddenStateExtractor(llm), prompts, [0.25, 0.5, 0.75])
    """
    wanted = sorted({resolve_layer(x, extractor.llm.num_layers) for x in layers})
    out = {layer: np.zeros((len(prompts), extractor.dim), dtype=np.float32) for layer in wanted}
    cache = extractor.cache
    keys = {layer: [prompt_key(extractor.llm.spec, layer, p) for p in prompts] for layer in wanted} if cache is not None else {}
    todo = set(range(len(prompts)))
    if cache is not None:
        found = {layer: cache.get_many(keys[layer]) for layer in wanted}
        todo = {i for i in range(len(prompts)) if any(keys[layer][i] not in found[layer] for layer in wanted)}
        for layer in wanted:
            for i, key in enumerate(keys[layer]):
                if i not in todo:
                    out[layer][i] = found[layer][key]
    order = sorted(todo, key=lambda i: len(prompts[i]))
    if order:  # a log reads a task's first report as what a resumed job found done: say "N to do" first
        report("hidden states", 0, len(order))
    for lo in range(0, len(order), extractor.batch_size):
        idx = order[lo : lo + extractor.batch_size]
        states = extractor._forward_batch([prompts[i] for i in idx], wanted)
        for layer in wanted:
            out[layer][idx] = states[layer]
            if cache is not None:
                cache.put_many({keys[layer][i]: states[layer][j] for j, i in enumerate(idx)})
        report("hidden states", lo + len(idx), len(order))  # minutes of forwards for a large fit: say so
    return out


def fill_layer_cache(
    extractor: HiddenStateExtractor,
    prompts: Sequence[str],
    layers: Sequence[int | float],
    *,
    chunk: int = 256,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Make sure ``extractor.cache`` holds every layer's state of every prompt; returns how many prompts were computed.

    States captured during generation are already there, so this computes only what is
    missing (a cache moved to another machine without its file, a deleted row): one
    early-exit forward per batch, stopped after the deepest layer, cached per batch so a
    kill loses at most one batch. Reads no vectors for prompts already complete.

    Example::

        cache = StateCache("states.sqlite")
        fill_layer_cache(HiddenStateExtractor(llm, cache=cache), prompts, range(1, llm.num_layers + 1))
        read_layer_states(cache, llm.spec, 15, prompts)  # (len(prompts), 576)
    """
    cache = extractor.cache
    if cache is None:
        raise RagsieveError("fill_layer_cache needs an extractor with a StateCache")
    wanted = sorted({resolve_layer(x, extractor.llm.num_layers) for x in layers})
    missing: set[int] = set()
    for layer in wanted:
        keys = [prompt_key(extractor.llm.spec, layer, p) for p in prompts]
        have = cache.has_many(keys)
        missing.update(i for i, key in enumerate(keys) if key not in have)
    todo = sorted(missing)
    if progress:
        progress(len(prompts) - len(todo))
    for lo in range(0, len(todo), chunk):
        part = todo[lo : lo + chunk]
        extract_layers(extractor, [prompts[i] for i in part], wanted)
        if progress:
            progress(len(part))
    return len(todo)


def read_layer_states(cache: "StateCache", model_spec: str, layer: int, prompts: Sequence[str]) -> np.ndarray:
    """One layer's cached states of ``prompts``, shape ``(len(prompts), dim)``; every one must be cached.

    One layer at a time keeps a sweep over 30 layers × 10k prompts at ~25 MB in memory.
    """
    keys = [prompt_key(model_spec, layer, p) for p in prompts]
    found = cache.get_many(keys)
    if len(found) < len(set(keys)):
        missing = sum(k not in found for k in keys)
        raise RagsieveError(f"{missing} of {len(prompts)} states of layer {layer} are not in {cache.path}; "
                            "run fill_layer_cache first")
    return np.stack([found[k] for k in keys]) if keys else np.zeros((0, 0), dtype=np.float32)


def full_forward_state(llm: "LocalLLM", prompt: str, layer: int) -> np.ndarray:
    """The reference path: one prompt, full forward with ``output_hidden_states=True``."""
    import torch

    enc = llm.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(llm.device)
    with torch.inference_mode():
        out = llm.model(**enc, output_hidden_states=True, use_cache=False)
    return out.hidden_states[layer][0, -1, :].float().cpu().numpy()
