"""Bi-encoder loading (sentence-transformers)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from ragsieve.errors import ModelNotAvailable
from ragsieve.models.embedded import get_embedded
from ragsieve.models.specs import DEFAULT_ENCODER, ModelSpec

if TYPE_CHECKING:  # keep `import ragsieve` light: torch loads only when a model does
    from sentence_transformers import SentenceTransformer


def resolve_encoder_path(spec: str) -> str:
    """Turn an encoder spec into something ``SentenceTransformer()`` accepts."""
    parsed = ModelSpec.parse(spec)
    if parsed.scheme == "embedded":
        return str(get_embedded(parsed.target, kind="sentence-transformers").path())
    if parsed.scheme == "openai":
        raise ModelNotAvailable(f"'{spec}': encoders must be local (embedded:, hf: id or path)")
    return parsed.target


@lru_cache(maxsize=4)
def load_encoder(spec: str = DEFAULT_ENCODER, device: str = "cpu") -> "SentenceTransformer":
    """Load a sentence-transformers bi-encoder (default: the embedded all-MiniLM-L6-v2).

    Example::

        enc = load_encoder()
        vecs = enc.encode(["a query", "a passage"], normalize_embeddings=True)
    """
    from sentence_transformers import SentenceTransformer

    target = resolve_encoder_path(spec)
    try:
        return SentenceTransformer(target, device=device)
    except OSError as exc:  # hub miss or missing files: say so in one line
        where = "local path" if Path(target).exists() else "HF id (offline: set a local path)"
        raise ModelNotAvailable(f"cannot load encoder '{spec}' as {where}: {str(exc).splitlines()[0]}") from exc
