"""Neural rerankers: bi-encoder cosine and cross-encoder (sentence-transformers)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.errors import ModelNotAvailable
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.rerank.base import BaseRanker


class BiEncoderRanker(BaseRanker):
    """Cosine similarity of MiniLM (or any sentence-transformers) embeddings.

    Example::

        BiEncoderRanker().rank("who wrote hamlet", ["Shakespeare wrote Hamlet.", "Paris"])
    """

    name = "bi-encoder"

    def __init__(self, encoder_spec: str = DEFAULT_ENCODER, batch_size: int = 64):
        from ragsieve.models.encoder import load_encoder

        self.encoder = load_encoder(encoder_spec)
        self.batch_size = batch_size

    def score(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        vecs = self.encoder.encode(
            [query] + [p.full_text for p in passages], batch_size=self.batch_size, normalize_embeddings=True
        )
        return vecs[1:] @ vecs[0]


class CrossEncoderRanker(BaseRanker):
    """A sentence-transformers ``CrossEncoder`` folder or HF id; score = its logit.

    Example::

        CrossEncoderRanker("results/rerank/base-cross-encoder").rank(query, passages)
    """

    name = "cross-encoder"

    def __init__(self, model: str = "", max_length: int = 512, batch_size: int = 32):
        from sentence_transformers import CrossEncoder

        if not model:
            raise ModelNotAvailable("cross-encoder needs a model: cross-encoder:<folder or HF id>")
        try:
            self.model = CrossEncoder(model, max_length=max_length, device="cpu")
        except OSError as exc:
            raise ModelNotAvailable(f"cannot load cross-encoder '{model}': {str(exc).splitlines()[0]}") from exc
        self.batch_size = batch_size

    def score(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        pairs = [(query, p.full_text) for p in passages]
        return np.asarray(self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False), dtype=float)
