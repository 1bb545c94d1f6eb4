"""Neural rerankers: bi-encoder cosine and cross-encoder (sentence-transformers)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ragsieve.artifacts import check_model_folder
from ragsieve.data.records import Passage
from ragsieve.errors import ModelNotAvailable, RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.rerank.base import BaseRanker, as_passages

if TYPE_CHECKING:
    from ragsieve.rerank.states import LayerOutput, PairStates
    from ragsieve.rerank.vectors import PassageVectorCache


class BiEncoderRanker(BaseRanker):
    """Cosine similarity of MiniLM (or any sentence-transformers) embeddings.

    Example::

        BiEncoderRanker().rank("who wrote hamlet", ["Shakespeare wrote Hamlet.", "Paris"])
        BiEncoderRanker(backend="onnx-int8").score("who wrote hamlet", ["Shakespeare wrote Hamlet."])
    """

    name = "bi-encoder"

    def __init__(self, encoder_spec: str = DEFAULT_ENCODER, batch_size: int | None = None, backend: str = "torch",
                 threads: int | None = None, vector_cache: "PassageVectorCache | None" = None):
        from ragsieve.models.encoder import encoder_batch_size, load_backend_encoder
        from ragsieve.rerank.vectors import PassageVectorCache

        # onnx-int8: ≈ 1.8× the passages/s of torch on one thread, cosines within ≈ 0.02 of fp32 (mean 0.006);
        # ``threads`` sets onnxruntime's (torch's is process-wide: torch.set_num_threads)
        self.encoder = load_backend_encoder(encoder_spec, backend, threads)
        self.batch_size = batch_size or encoder_batch_size(backend)
        self.backend = backend
        self.encoder_spec = encoder_spec
        # passages without a stored vector: encoded once per process while they stay in the cache
        self.vector_cache = vector_cache if vector_cache is not None else PassageVectorCache()
        self.stored_vectors = 0  # passages whose index vector was read instead of encoding them
        self.encoded_passages = 0

    def window(self):
        """The encoder's passage window (a query is encoded apart, so the whole window is the passage's)."""
        from ragsieve.models.onnx import fast_tokenizer

        tokenizer = self.encoder.tokenizer
        if not hasattr(tokenizer, "convert_ids_to_tokens"):  # an ONNX encoder's tokenizers.Tokenizer
            tokenizer = fast_tokenizer(tokenizer)
        return tokenizer, int(self.encoder.max_seq_length)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """L2-normalised embeddings of ``texts`` on this ranker's backend (and its autocast), in input order."""
        from ragsieve.models.cpu import autocast

        with autocast(self.backend):
            return self.encoder.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True)

    def score_pairs(self, queries: Sequence[str], passages: Sequence[Passage | str]) -> np.ndarray:
        """Cosines of aligned pairs; each distinct query is encoded once."""
        if len(queries) != len(passages):
            raise RagsieveError(f"got {len(queries)} queries but {len(passages)} passages")
        if not queries:
            return np.zeros(0, dtype=float)
        unique = list(dict.fromkeys(queries))
        q, p = self.embed(unique), self.passage_embeddings(as_passages(passages))
        row = {text: i for i, text in enumerate(unique)}
        return np.einsum("ij,ij->i", q[[row[t] for t in queries]], p).astype(np.float64)

    def passage_embeddings(self, passages: Sequence[Passage]) -> np.ndarray:
        """Unit vectors of ``passages``' full text: the index's stored vector when a passage carries one from this
        encoder, else the cache's, else encoded now (and cached); each distinct text is encoded once."""
        from ragsieve.data.records import stored_vector
        from ragsieve.rerank.vectors import vector_key

        vectors: list[np.ndarray | None] = [stored_vector(p, self.encoder_spec) for p in passages]
        stored = sum(v is not None for v in vectors)
        missing = [i for i, v in enumerate(vectors) if v is None]
        texts = [passages[i].full_text for i in missing]
        keys = [vector_key(f"{self.encoder_spec}|{self.backend}", t) for t in texts]
        for i, v in zip(missing, self.vector_cache.get_many(keys)):
            vectors[i] = v
        todo = {k: t for k, t, i in zip(keys, texts, missing) if vectors[i] is None}
        if todo:
            fresh = self.embed(list(todo.values()))
            self.vector_cache.put_many(list(todo), fresh)
            made = dict(zip(todo, fresh))
            for k, i in zip(keys, missing):
                if vectors[i] is None:
                    vectors[i] = made[k]
        self.stored_vectors += stored
        self.encoded_passages += len(todo)
        return np.stack([np.asarray(v, dtype=np.float32) for v in vectors])

    def vector_stats(self) -> dict[str, int | float]:
        """Where passage vectors came from so far: the index (``stored``), the cache, or the encoder."""
        return {"stored": self.stored_vectors, "encoded": self.encoded_passages,
                **{f"cache_{k}": v for k, v in self.vector_cache.stats().items()}}


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
        import torch
        from sentence_transformers import CrossEncoder

        from ragsieve.rerank.fast import make_forward

        if not model:
            raise ModelNotAvailable("cross-encoder needs a model: cross-encoder:<folder or HF id>")
        if Path(model).is_dir():  # a truncated copy fails here in one line, not deep inside transformers
            check_model_folder(model, f"retrain it (`ragsieve rerank train`) or copy it again to {model}")
        try:
            # fp32 even from fp16 folders (the shipped one): fp16 on CPU is slower, not faster
            self.model = CrossEncoder(model, max_length=max_length, device="cpu", model_kwargs={"dtype": torch.float32})
        except OSError as exc:
            raise ModelNotAvailable(f"cannot load cross-encoder '{model}': {str(exc).splitlines()[0]}") from exc
        self.batch_size = batch_size
        self.backend = backend
        self.model_dir = model
        self._forward = None if backend == "torch" else make_forward(backend, self.model, model)
        self.states: PairStates | None = None  # what record_states keeps of each forward
        self._layer_output: LayerOutput | None = None

    #: backends whose forward runs the torch module itself (a hook sees its layers; int8 runs a quantised copy)
    RECORDING_BACKENDS = ("torch", "torch-bf16")

    def record_states(self, layer: int) -> PairStates | None:
        """From now on keep each pair's hidden states after encoder layer ``layer`` (1-based) in :attr:`states`,
        for a reader that carries on from there (a keep head's branch); None when this backend's forward does not
        run the torch layers. Recording adds no computation: a forward hook copies the layer's output."""
        from ragsieve.rerank.fast import make_forward
        from ragsieve.rerank.states import LayerOutput, PairStates

        if self.backend not in self.RECORDING_BACKENDS:
            return None
        if self.states is not None:
            return self.states if self.states.layer == layer else None
        layers = self.model.model.base_model.encoder.layer
        if not 1 <= layer <= len(layers):
            raise RagsieveError(f"record_states: layer must be in [1, {len(layers)}]")
        self.states = PairStates(layer, self.backend, int(self.model.max_seq_length))
        if self._forward is None:  # CrossEncoder.predict hides its batches: the bucketed path pairs rows to inputs
            self._forward = make_forward(self.backend, self.model, self.model_dir)
        self._layer_output = LayerOutput()
        layers[layer - 1].register_forward_hook(self._layer_output)
        return self.states

    def score_pairs(self, queries: Sequence[str], passages: Sequence[Passage | str]) -> np.ndarray:
        if len(queries) != len(passages):
            raise RagsieveError(f"got {len(queries)} queries but {len(passages)} passages")
        return self.predict_pairs([(q, p.full_text) for q, p in zip(queries, as_passages(passages))])

    def window(self):
        return self.model.tokenizer, int(self.model.max_seq_length)

    def predict_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Activated logits for (query, passage text) tuples, batched on the configured backend."""
        return self._predict(pairs, activated=True)

    def predict_logits(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Raw logits (no sigmoid): exact where a sigmoid output would saturate, e.g. as a distillation teacher."""
        return self._predict(pairs, activated=False)

    def _predict(self, pairs: Sequence[tuple[str, str]], activated: bool) -> np.ndarray:
        import torch

        if self._forward is None:
            scores = self.model.predict(list(pairs), batch_size=self.batch_size, show_progress_bar=False,
                                        activation_fn=None if activated else torch.nn.Identity())
            return np.asarray(scores, dtype=float)

        from ragsieve.models.onnx import PAD_BUCKET, bucketed_batches

        # batch-invariant: one padded width per batch (bf16 results move with it), and a backend quantising
        # activations per batch (torch-int8) scores each pair alone, unpadded
        invariant = self.backend != "torch-int8"
        bucket, size = (PAD_BUCKET, self.batch_size) if invariant else (1, 1)
        lengths = [len(ids) for ids in self.model.tokenizer(
            [q for q, _ in pairs], [p for _, p in pairs], truncation="longest_first",
            max_length=int(self.model.max_seq_length))["input_ids"]]
        out = np.zeros(len(pairs), dtype=float)
        for idx in bucketed_batches(lengths, size, bucket):
            features = self.model.preprocess([pairs[i] for i in idx],
                                             processing_kwargs={"text": {"pad_to_multiple_of": bucket}})
            logits = torch.from_numpy(np.asarray(self._forward(features), dtype=np.float32))
            if self.states is not None:
                self._keep_states([pairs[i] for i in idx], features["attention_mask"])
            if activated:
                logits = self.model.activation_fn(logits)
            out[idx] = logits.reshape(len(idx), -1)[:, 0].numpy()
        return out

    def _keep_states(self, pairs: Sequence[tuple[str, str]], attention_mask) -> None:
        import torch

        hidden = self._layer_output.take()
        if hidden is None:
            return
        for row, ((query, text), n) in enumerate(zip(pairs, attention_mask.sum(1).tolist())):
            self.states.put(query, text, hidden[row, :n].to(torch.float16).clone())
