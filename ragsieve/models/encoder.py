"""Bi-encoder loading (sentence-transformers)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ragsieve.errors import ModelNotAvailable
from ragsieve.specs import DEFAULT_ENCODER, ModelSpec, get_embedded

if TYPE_CHECKING:  # keep `import ragsieve` light: torch loads only when a model does
    from sentence_transformers import SentenceTransformer


def resolve_encoder_path(spec: str) -> str:
    """Turn an encoder spec into something ``SentenceTransformer()`` accepts."""
    parsed = ModelSpec.parse(spec)
    if parsed.is_embedded:
        return str(get_embedded(parsed.target, kind="sentence-transformers").path())
    if parsed.is_endpoint:
        raise ModelNotAvailable(f"'{spec}': encoders must be local (embedded:, hf: id or path)")
    return parsed.target


#: bi-encoder backends: ``torch`` = ``SentenceTransformer`` itself (``torch-bf16``: under bf16 autocast);
#: ``onnx`` / ``onnx-int8`` (onnxruntime) and ``openvino-bf16`` (OpenVINO) = :class:`OnnxEncoder`
ENCODER_BACKENDS = ("torch", "torch-bf16", "onnx", "onnx-int8", "openvino-bf16")


def encoder_batch_size(backend: str) -> int:
    """Texts per forward for a backend: sentence-transformers' 64 on torch, :data:`ragsieve.models.onnx.ONNX_BATCH`
    on onnxruntime (small batches run fastest there; int8 quantises activations per batch)."""
    from ragsieve.models.onnx import ONNX_BATCH

    return 64 if backend in ("torch", "torch-bf16") else ONNX_BATCH


#: what "the vectors match fp32" means for an index encoder backend: every vector within this cosine of torch
#: fp32's for the same text, and recall@10 of the index built with it within :data:`INDEX_RECALL_TOLERANCE` of an
#: fp32-built index's (tests/test_index_backends.py checks the first, bench/index.py measures both)
INDEX_MIN_COSINE = 0.999
INDEX_RECALL_TOLERANCE = 0.005
#: backends an index may encode on: those within that tolerance (onnx-int8's vectors are not: min cosine ≈ 0.986)
INDEX_ENCODER_BACKENDS = ("torch", "torch-bf16", "onnx", "openvino-bf16")
#: the default where the CPU has bf16 matrix units: OpenVINO bf16, ≈ 2.56× torch fp32's chunks/s on 200-token
#: chunks (bench/results/index.json), cosine to fp32 ≥ 0.9999
INDEX_DEFAULT_BACKEND = "openvino-bf16"


def index_encoder_backend(requested: str | None = None, spec: str = DEFAULT_ENCODER) -> str:
    """The backend an index encodes on: ``requested`` (an :data:`INDEX_ENCODER_BACKENDS` name), or by default
    :data:`INDEX_DEFAULT_BACKEND` on a CPU with bf16 matrix units for an encoder :class:`OnnxEncoder` can run
    (:func:`onnx_exportable`) and torch fp32 otherwise; then as this process can run it
    (:func:`ragsieve.models.cpu.cpu_backend`: no OpenVINO beside jemalloc, no bf16 without the units).

    Example::

        index_encoder_backend()          # 'openvino-bf16' on a CPU with AVX512-BF16 or AMX, else 'torch'
        index_encoder_backend("onnx")    # 'onnx'
    """
    from ragsieve.models.cpu import cpu_backend, fast_bf16

    if not requested:
        requested = INDEX_DEFAULT_BACKEND if fast_bf16() and onnx_exportable(spec) else "torch"
    if requested not in INDEX_ENCODER_BACKENDS:
        raise ModelNotAvailable(f"encoder backend '{requested}' cannot build an index; known: "
                                f"{', '.join(INDEX_ENCODER_BACKENDS)} (onnx-int8 vectors stray too far from fp32)")
    return cpu_backend(requested)


def onnx_exportable(spec: str) -> bool:
    """Whether :class:`OnnxEncoder` can run the sentence-transformers folder ``spec`` names: a local folder with
    ``tokenizer.json`` and weights, whose modules are a transformer, mean pooling and at most a normalisation."""
    import json

    try:
        folder = Path(resolve_encoder_path(spec))
        modules = json.loads((folder / "modules.json").read_text())
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        pooling = json.loads((folder / modules[1]["path"] / "config.json").read_text()) if len(modules) > 1 else {}
    except (ModelNotAvailable, OSError, ValueError, KeyError, IndexError, TypeError):
        return False
    weights = any((folder / n).is_file() for n in ("model.safetensors", "pytorch_model.bin"))
    modes = {k for k, v in pooling.items() if k.startswith("pooling_mode_") and v}
    return ((folder / "tokenizer.json").is_file() and weights and kinds[:2] == ["Transformer", "Pooling"]
            and set(kinds[2:]) <= {"Normalize"} and modes == {"pooling_mode_mean_tokens"})


def load_backend_encoder(spec: str = DEFAULT_ENCODER, backend: str = "torch", threads: int | None = None,
                         bulk: bool = False) -> "SentenceTransformer | OnnxEncoder":
    """The bi-encoder ``spec`` on ``backend`` (an :data:`ENCODER_BACKENDS` name): ``SentenceTransformer`` for the
    torch ones (bf16 autocast is the caller's: :func:`ragsieve.models.cpu.autocast`), else :class:`OnnxEncoder`;
    ``bulk`` (an index build) compiles OpenVINO for throughput rather than one call's latency.

    Example::

        load_backend_encoder("embedded:all-minilm-l6-v2", "openvino-bf16").encode(["a passage"])
    """
    if backend in ("torch", "torch-bf16"):
        return load_encoder(spec)
    return load_onnx_encoder(spec, backend, threads, bulk)


@lru_cache(maxsize=4)
def load_onnx_encoder(spec: str = DEFAULT_ENCODER, backend: str = "onnx-int8",
                      threads: int | None = None, bulk: bool = False) -> "OnnxEncoder":
    """The bi-encoder's ONNX export (on first use) on onnxruntime (``onnx`` fp32 or ``onnx-int8``) or OpenVINO
    (``openvino-bf16``); ``encode()`` as :func:`load_encoder`'s.

    Example::

        load_onnx_encoder().encode(["a query", "a passage"], normalize_embeddings=True)
    """
    if backend not in ("onnx", "onnx-int8", "openvino-bf16"):
        raise ModelNotAvailable(f"unknown encoder backend '{backend}'; known: {', '.join(ENCODER_BACKENDS)}")
    from ragsieve.models.onnx import onnx_engine

    return OnnxEncoder(spec, int8=backend == "onnx-int8", threads=threads, engine=onnx_engine(backend),
                       throughput=bulk)


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


class OnnxEncoder:
    """A sentence-transformers bi-encoder's transformer on onnxruntime (int8 per-channel by default) or OpenVINO
    (``engine="openvino-bf16"``, the fp32 export), with the
    model's own tokenizer, truncation, mean pooling and normalisation: ``encode()`` as ``SentenceTransformer``'s,
    for the cosine term of a mixed reranker. The ONNX file is exported once from the model's weights (torch is
    needed then, not after) to ``$RAGSIEVE_CACHE/onnx/encoder-<weights digest>/``.

    Only mean pooling is supported (all-MiniLM-L6-v2's; ``load_encoder`` serves any other).

    Example::

        enc = OnnxEncoder("embedded:all-minilm-l6-v2", int8=True, threads=1)
        vecs = enc.encode(["a query", "a passage"], batch_size=8, normalize_embeddings=True)
    """

    def __init__(self, spec: str = DEFAULT_ENCODER, int8: bool = True, threads: int | None = None,
                 engine: str = "onnxruntime", throughput: bool = False):
        from tokenizers import Tokenizer

        from ragsieve.models.onnx import OnnxModel

        target = Path(resolve_encoder_path(spec))
        if not (target / "tokenizer.json").is_file():
            raise ModelNotAvailable(f"encoder '{spec}': the onnx backend needs a local folder with tokenizer.json")
        path, self.max_seq_length = _export_encoder(spec, target, int8)
        self.tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_seq_length)
        self.model = OnnxModel(path, engine, threads, throughput=throughput)
        self.backend = "openvino-bf16" if engine == "openvino-bf16" else ("onnx-int8" if int8 else "onnx")
        self._dim: int | None = None

    def get_sentence_embedding_dimension(self) -> int:
        """The vectors' width (``SentenceTransformer``'s name for it), read from one forward."""
        if self._dim is None:
            self._dim = int(self.encode(["a"]).shape[1])
        return self._dim

    def encode(self, texts: Sequence[str], batch_size: int = 32, normalize_embeddings: bool = True,
               **_: object) -> np.ndarray:
        """Mean-pooled token states of ``texts`` (length-sorted batches, input order back), L2-normalised. The
        graph pools (:func:`_export_encoder`), so only a vector per text leaves it."""
        from ragsieve.models.onnx import model_batches

        out: np.ndarray | None = None
        # each batch's input positions are its key: results come back in any order
        for idx, vecs in self.model.run_batches(model_batches(self.model, self.tokenizer.encode_batch(list(texts)),
                                                              batch_size)):
            if out is None:
                out = np.zeros((len(texts), vecs.shape[1]), dtype=np.float32)
            out[idx] = vecs
        if out is None:
            return np.zeros((0, 0), dtype=np.float32)
        if normalize_embeddings:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out


#: what an exported encoder graph is; a new value re-exports. 2: the graph mean-pools (a vector per text leaves it,
#: not every token's state: copying and pooling those in Python held a core the other OpenVINO stream needed) and
#: its attention is exported from the eager implementation, which OpenVINO fuses better than the SDPA export
#: (800 HotpotQA 200-token chunks, bf16, 2 streams, batch 16: 75.0 chunks/s against 72.4 for SDPA and 70.7 for
#: version 1)
ENCODER_GRAPH_VERSION = 2


def _export_encoder(spec: str, folder: Path, int8: bool) -> tuple[Path, int]:
    """(ONNX file, max tokens) of a sentence-transformers folder's transformer with mean pooling, exported once
    per weights (and :data:`ENCODER_GRAPH_VERSION`)."""
    import json

    from filelock import FileLock

    from ragsieve.artifacts import weights_key
    from ragsieve.atomic import atomic_file
    from ragsieve.paths import cache_dir

    weights = next((n for n in ("model.safetensors", "pytorch_model.bin") if (folder / n).is_file()), None)
    if weights is None:
        raise ModelNotAvailable(f"encoder '{spec}': no model.safetensors in {folder}")
    out = cache_dir() / "onnx" / f"encoder-v{ENCODER_GRAPH_VERSION}-{weights_key(folder, weights)}"
    fp32, q8, meta = out / "model.onnx", out / "model.int8.onnx", out / "encoder.json"
    target = q8 if int8 else fp32
    if target.is_file() and meta.is_file():
        return target, int(json.loads(meta.read_text())["max_seq_length"])
    out.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out / ".lock")):
        if not fp32.is_file() or not meta.is_file():
            import torch

            model = load_encoder(spec)
            pooler = model[1] if len(model) > 1 else None
            pooling = getattr(pooler, "pooling_mode", None) or (
                pooler.get_pooling_mode_str() if hasattr(pooler, "get_pooling_mode_str") else "none")
            if pooling != "mean":
                raise ModelNotAvailable(f"encoder '{spec}' pools by '{pooling}': the onnx backend pools the mean only")
            transformer = model[0].auto_model.eval()
            transformer.set_attn_implementation("eager")  # the pattern OpenVINO fuses best (ENCODER_GRAPH_VERSION)

            class MeanPooled(torch.nn.Module):
                def __init__(self) -> None:
                    super().__init__()
                    self.inner = transformer

                def forward(self, input_ids, attention_mask, token_type_ids):
                    states = self.inner(input_ids=input_ids, attention_mask=attention_mask,
                                        token_type_ids=token_type_ids).last_hidden_state
                    mask = attention_mask.unsqueeze(-1).to(states.dtype)
                    return (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

            sample = model.tokenizer(["a passage to embed"], return_tensors="pt")
            names = ["input_ids", "attention_mask", "token_type_ids"]
            dynamic = {**{n: {0: "batch", 1: "sequence"} for n in names}, "sentence_embedding": {0: "batch"}}
            with atomic_file(fp32) as tmp:
                torch.onnx.export(MeanPooled(), tuple(sample[n] for n in names), str(tmp), input_names=names,
                                  output_names=["sentence_embedding"], dynamic_axes=dynamic, opset_version=17,
                                  dynamo=False)
            with atomic_file(meta) as tmp:
                tmp.write_text(json.dumps({"spec": spec, "max_seq_length": int(model.max_seq_length)}))
        if int8 and not q8.is_file():
            from onnxruntime.quantization import QuantType, quantize_dynamic

            with atomic_file(q8) as tmp:
                quantize_dynamic(str(fp32), str(tmp), per_channel=True, weight_type=QuantType.QInt8)
    return target, int(json.loads(meta.read_text())["max_seq_length"])
