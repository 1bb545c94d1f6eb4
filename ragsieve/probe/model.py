"""The knowledge-boundary probe: an MLP over a pre-token hidden state → P(correct).

``ConfidenceProbe.score(question, context=None)`` is Conf(Q) without a context and
Conf(Q+C) with one. It formats exactly the prompt the LLM answers (same templates,
same token budget) so the state it reads is the state the answer comes from.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ragsieve.artifacts import (
    PROBE_REBUILD,
    check_safetensors,
    damaged,
    read_json_artifact,
    reading_artifact,
    state_dict_mismatch,
)
from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError

if TYPE_CHECKING:
    import torch

    from ragsieve.models.llm import LocalLLM
    from ragsieve.probe.cache import StateCache
    from ragsieve.probe.hidden import HiddenStateExtractor

CONFIG_FILE = "probe_config.json"
WEIGHTS_FILE = "probe.safetensors"


@dataclass
class ProbeConfig:
    """What a saved probe was trained on; loading checks it against the live LLM."""

    llm_spec: str
    layer: int  # resolved hidden-state index
    num_layers: int
    hidden_size: int
    probe_hidden: int = 256
    dropout: float = 0.5
    max_prompt_tokens: int = 1024
    prompts: str | None = None  # QA prompt file; None = packaged default
    metrics: dict = field(default_factory=dict)


def build_mlp(input_dim: int, hidden: int, dropout: float = 0.5) -> "torch.nn.Module":
    """Linear → ReLU → Dropout → Linear(2): logits over {incorrect, correct}."""
    from torch import nn

    return nn.Sequential(nn.Linear(input_dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 2))


class ProbeHead:
    """The trainable part: feature standardisation + MLP. Independent of the LLM."""

    def __init__(self, input_dim: int, hidden: int = 256, dropout: float = 0.5):
        import torch

        self.mlp = build_mlp(input_dim, hidden, dropout)
        # Mid-layer states have a few huge dimensions (|h| ~ 100); standardising keeps
        # the MLP from being dominated by them at the paper's small learning rate.
        self.mean = torch.zeros(input_dim)
        self.std = torch.ones(input_dim)

    def fit_scaler(self, states: np.ndarray) -> None:
        import torch

        self.mean = torch.from_numpy(states.mean(0).astype(np.float32))
        self.std = torch.from_numpy(states.std(0).astype(np.float32)).clamp(min=1e-4)

    def logits(self, states: "torch.Tensor") -> "torch.Tensor":
        return self.mlp((states - self.mean) / self.std)

    def predict_proba(self, states: np.ndarray, batch_size: int = 1024) -> np.ndarray:
        """P(correct) for each row of ``states``."""
        import torch

        self.mlp.eval()
        out = []
        with torch.inference_mode():
            for lo in range(0, len(states), batch_size):
                x = torch.from_numpy(np.asarray(states[lo : lo + batch_size], dtype=np.float32))
                out.append(torch.softmax(self.logits(x), dim=-1)[:, 1].numpy())
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    def state_dict(self) -> dict[str, "torch.Tensor"]:
        sd = {f"mlp.{k}": v.detach().clone() for k, v in self.mlp.state_dict().items()}
        sd["scaler.mean"], sd["scaler.std"] = self.mean.clone(), self.std.clone()
        return sd

    def load_state_dict(self, sd: dict[str, "torch.Tensor"]) -> None:
        self.mlp.load_state_dict({k[4:]: v for k, v in sd.items() if k.startswith("mlp.")})
        self.mean, self.std = sd["scaler.mean"], sd["scaler.std"]


class ConfidenceProbe:
    """Conf(prompt) for one LLM at one layer.

    Example::

        probe = ConfidenceProbe.load("embedded:smollm2-nq", llm)   # or a folder
        probe.score("who wrote hamlet?")                      # Conf(Q)
        probe.score("who wrote hamlet?", Passage("p", "..."))  # Conf(Q+C)
    """

    def __init__(
        self, llm: "LocalLLM", head: ProbeHead, config: ProbeConfig, *, batch_size: int = 16,
        cache: "StateCache | None" = None,
    ):
        from ragsieve.prompts import load_qa_prompts
        from ragsieve.prompts.builder import PromptBuilder
        from ragsieve.probe.hidden import HiddenStateExtractor

        _check_compatible(config, llm)
        self.llm, self.head, self.config = llm, head, config
        self.builder = PromptBuilder(llm, load_qa_prompts(config.prompts), config.max_prompt_tokens)
        # a StateCache makes repeated prompts (same LLM, layer, text) free
        self.extractor: HiddenStateExtractor = HiddenStateExtractor(
            llm, config.layer, batch_size=batch_size, cache=cache
        )

    def prompts(self, questions: Sequence[str], contexts: Sequence[Sequence[Passage] | Passage | None]) -> list[str]:
        """The exact chat-formatted prompts the LLM answers for (question, context)."""
        out = []
        for q, c in zip(questions, contexts, strict=True):
            if not q or not q.strip():
                raise RagsieveError("empty question")
            ctx = [] if c is None else [c] if isinstance(c, Passage) else list(c)
            out.append(self.builder.chat_prompt(q.strip(), ctx))
        return out

    def score_batch(
        self, questions: Sequence[str], contexts: Sequence[Sequence[Passage] | Passage | None] | None = None
    ) -> np.ndarray:
        contexts = contexts if contexts is not None else [None] * len(questions)
        return self.head.predict_proba(self.extractor.extract(self.prompts(questions, contexts)))

    def score(self, question: str, context: Sequence[Passage] | Passage | None = None) -> float:
        return float(self.score_batch([question], [context])[0])

    # -- persistence ----------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()}, str(path / WEIGHTS_FILE))
        (path / CONFIG_FILE).write_text(json.dumps(asdict(self.config), indent=2) + "\n")
        return path

    @classmethod
    def load(
        cls, path: str | Path, llm: "LocalLLM", *, layer: int | float | None = None, **kwargs
    ) -> "ConfidenceProbe":
        """Load a saved probe for ``llm``; refused if it was trained on another LLM or layer."""
        from ragsieve.probe.hidden import resolve_layer

        config, head = load_head(path)
        if layer is not None and resolve_layer(layer, llm.num_layers) != config.layer:
            raise RagsieveError(
                f"probe at {path} was trained on layer {config.layer}, not layer "
                f"{resolve_layer(layer, llm.num_layers)}; train one for that layer"
            )
        return cls(llm, head, config, **kwargs)


def load_head(path: str | Path) -> tuple[ProbeConfig, ProbeHead]:
    """A saved probe's config and MLP head (a folder, or ``embedded:<name>``); one-line errors for damage."""
    from safetensors.torch import load_file

    from ragsieve.paths import resolve_artifact

    path = resolve_artifact("probes", path)
    if not (path / CONFIG_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
        raise RagsieveError(f"{path}: not a saved probe (needs {CONFIG_FILE} and {WEIGHTS_FILE}); {PROBE_REBUILD}")
    config = read_probe_config(path / CONFIG_FILE)
    weights = path / WEIGHTS_FILE
    check_safetensors(weights, PROBE_REBUILD)
    head = ProbeHead(config.hidden_size, config.probe_hidden, config.dropout)
    with reading_artifact(weights, PROBE_REBUILD):
        state = load_file(str(weights))
    if mismatch := state_dict_mismatch(head.state_dict(), state):
        raise damaged(weights, f"does not match {CONFIG_FILE}: {mismatch}", PROBE_REBUILD)
    head.load_state_dict(state)
    return config, head


#: the JSON types each ProbeConfig field accepts (checked by hand: the dataclass checks none)
_CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    "llm_spec": (str,), "layer": (int,), "num_layers": (int,), "hidden_size": (int,), "probe_hidden": (int,),
    "dropout": (int, float), "max_prompt_tokens": (int,), "prompts": (str, type(None)), "metrics": (dict,),
}


def read_probe_config(file: Path) -> ProbeConfig:
    """``probe_config.json`` with its types checked: ``"layer": "15"`` would fail much later, obscurely."""
    data = read_json_artifact(file, PROBE_REBUILD)
    problems = [f"unknown key '{k}'" for k in data if k not in _CONFIG_TYPES]
    for name, f in ProbeConfig.__dataclass_fields__.items():
        if name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                problems.append(f"'{name}' missing")
            continue
        value, kinds = data[name], _CONFIG_TYPES[name]
        if isinstance(value, bool) or not isinstance(value, kinds):
            problems.append(f"'{name}' should be {' or '.join(k.__name__ for k in kinds)}, got {value!r}")
    if problems:
        raise RagsieveError(f"{file}: {'; '.join(problems)}; {PROBE_REBUILD}")
    return ProbeConfig(**data)


def _check_compatible(config: ProbeConfig, llm: "LocalLLM") -> None:
    """A probe reads one LLM's geometry at one layer; anything else would be noise."""
    if config.llm_spec != llm.spec:
        raise RagsieveError(f"probe was trained on LLM '{config.llm_spec}', not '{llm.spec}'; train one for this LLM")
    if (config.num_layers, config.hidden_size) != (llm.num_layers, llm.hidden_size):
        raise RagsieveError(
            f"probe expects {config.num_layers} layers × {config.hidden_size} wide, "
            f"LLM has {llm.num_layers} × {llm.hidden_size}; {PROBE_REBUILD} for this LLM"
        )
    if not 1 <= config.layer <= llm.num_layers:
        raise RagsieveError(f"probe layer {config.layer} does not exist in a {llm.num_layers}-layer LLM")
