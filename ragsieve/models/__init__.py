"""Model loading: every model is named by a spec string (see :mod:`.specs`)."""

from ragsieve.models.embedded import EMBEDDED_MODELS, EmbeddedModel, get_embedded
from ragsieve.models.encoder import load_encoder, resolve_encoder_path
from ragsieve.models.llm import Generator, LocalLLM, OpenAIChatLLM, load_llm, load_local_llm, resolve_llm_path
from ragsieve.models.specs import DEFAULT_ENCODER, DEFAULT_LLM, ModelSpec

__all__ = [
    "DEFAULT_ENCODER",
    "DEFAULT_LLM",
    "EMBEDDED_MODELS",
    "EmbeddedModel",
    "Generator",
    "LocalLLM",
    "ModelSpec",
    "OpenAIChatLLM",
    "get_embedded",
    "load_encoder",
    "load_llm",
    "load_local_llm",
    "resolve_encoder_path",
    "resolve_llm_path",
]
