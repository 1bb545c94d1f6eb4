"""Model specs: one string names any model ragsieve can use.

* ``embedded:<name>``            a model shipped in a PyPI package (see :mod:`.embedded`)
* ``openai:<base_url>#<model>``  an OpenAI-compatible chat endpoint (vLLM, Ollama, ...)
* ``hf:<id-or-path>`` or a bare HF model id / local path
"""

from __future__ import annotations

from dataclasses import dataclass

from ragsieve.errors import ModelNotAvailable

DEFAULT_LLM = "embedded:smollm2-135m-instruct"
DEFAULT_ENCODER = "embedded:all-minilm-l6-v2"


@dataclass(frozen=True)
class ModelSpec:
    scheme: str  # "embedded" | "openai" | "hf"
    target: str  # embedded name, base URL, or HF id / path
    model: str = ""  # served model name (openai only)

    @classmethod
    def parse(cls, spec: str) -> "ModelSpec":
        spec = (spec or "").strip()
        if not spec:
            raise ModelNotAvailable("empty model spec; use embedded:<name>, openai:<url>#<model> or an HF id/path")
        scheme, sep, rest = spec.partition(":")
        if sep and scheme == "embedded":
            return cls("embedded", rest)
        if sep and scheme == "openai":
            base_url, _, model = rest.partition("#")
            if not base_url.startswith(("http://", "https://")) or not model:
                raise ModelNotAvailable(
                    f"bad endpoint spec '{spec}'; expected openai:<http(s)://host:port/v1>#<model-name>"
                )
            return cls("openai", base_url.rstrip("/"), model)
        if sep and scheme == "hf":
            return cls("hf", rest)
        # bare HF id or path (a Windows drive or URL-less path never reaches here on Linux)
        return cls("hf", spec)

    def __str__(self) -> str:
        if self.scheme == "openai":
            return f"openai:{self.target}#{self.model}"
        return f"{self.scheme}:{self.target}"
