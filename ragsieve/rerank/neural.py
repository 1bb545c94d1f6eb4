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
    """A sentence-transformers ``CrossEncoder`` folder or HF id; score = its activated logit.

    ``backend`` picks the forward pass (see :mod:`ragsieve.rerank.fast`): ``torch`` is
    ``CrossEncoder.predict`` itself; ``torch-int8``, ``onnx`` and ``onnx-int8`` feed the
    same tokenised, length-sorted batches to a cheaper forward.

    Example::

        CrossEncoderRanker("results/rerank/base-cross-encoder").rank(query, passages)
        CrossEncoderRanker(path, backend="onnx-int8").top_k(query, passages, 3)
    """

    name = "cross-encoder"
    score_is_probability = True  # the 1-logit head's sigmoid

    def __init__(self, model: str = "", max_length: int = 512, batch_size: int = 32, backend: str = "torch"):
        from sentence_transformers import CrossEncoder

        from ragsieve.rerank.fast import make_forward

        if not model:
            raise ModelNotAvailable("cross-encoder needs a model: cross-encoder:<folder or HF id>")
        try:
            self.model = CrossEncoder(model, max_length=max_length, device="cpu")
        except OSError as exc:
            raise ModelNotAvailable(f"cannot load cross-encoder '{model}': {str(exc).splitlines()[0]}") from exc
        self.batch_size = batch_size
        self.backend = backend
        self._forward = None if backend == "torch" else make_forward(backend, self.model, model)

    def score(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        return self.score_pairs([(query, p.full_text) for p in passages])

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        if self._forward is None:
            scores = self.model.predict(list(pairs), batch_size=self.batch_size, show_progress_bar=False)
            return np.asarray(scores, dtype=float)
        import torch

        # longest first, like CrossEncoder.predict, so each batch pads little
        order = np.argsort([-(len(q) + len(p)) for q, p in pairs], kind="stable")
        out = np.zeros(len(pairs), dtype=float)
        for lo in range(0, len(order), self.batch_size):
            idx = order[lo : lo + self.batch_size]
            features = self.model.preprocess([pairs[i] for i in idx])
            logits = torch.from_numpy(np.asarray(self._forward(features), dtype=np.float32))
            out[idx] = self.model.activation_fn(logits).reshape(len(idx), -1)[:, 0].numpy()
        return out
