"""Model specs: one string names any model ragsieve can use (parsed by :class:`ragsieve.specs.ModelSpec`).

* ``embedded:<name>``            a model shipped in a PyPI package (:data:`ragsieve.specs.EMBEDDED_TABLE`)
* ``openai:<base_url>#<model>``  an OpenAI-compatible chat endpoint (vLLM, Ollama, ...)
* ``hf:<id-or-path>`` or a bare HF model id / local path

Kept so that ``from ragsieve.models.specs import ModelSpec`` still works; the grammar lives in :mod:`ragsieve.specs`.
"""

from __future__ import annotations

from ragsieve.specs import DEFAULT_ENCODER, DEFAULT_LLM, ModelSpec

__all__ = ["DEFAULT_ENCODER", "DEFAULT_LLM", "ModelSpec"]
