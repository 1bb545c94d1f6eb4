"""``embedded:base`` — the base cross-encoder that ships inside the package, ready to use.

The folder ``ragsieve/assets/base-reranker/`` holds a standard sentence-transformers
CrossEncoder (fp16 safetensors + tokenizer; ``CrossEncoder(path)`` loads it outside
ragsieve), its int8 per-channel ONNX export, and ``ragsieve_reranker.json``: the recipe
that trained it, the MiniLM-cosine term mixed into its logit, the default backends of both
models (chosen by measurement: the fastest whose held-out nDCG@10 stays within 0.005 of fp32;
bf16 where the CPU has bf16 units, ``without_bf16`` otherwise), the max length and the
calibration fitted on dev.

Loading never trains. Retraining is explicit: ``ragsieve run experiments/rerank_base.yaml``.

The ONNX path needs neither torch nor sentence-transformers at load time: the tokenizer
is the ``tokenizers`` one from ``tokenizer.json`` (same ids as ``CrossEncoder.preprocess``),
pairs are sorted by token length and batched by padded width (8-token buckets: batch-invariant scores), and the scores go
back to input order.

Example::

    ranker = load_reranker("embedded:base")           # the card's backends; a long passage by its best chunk
    ranker.rank("who wrote hamlet", ["Hamlet is by Shakespeare.", "Paris"]).top_k(1)
    ranker.predict_proba("who wrote hamlet", ["Hamlet is by Shakespeare."])
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ragsieve.artifacts import weights_key
from ragsieve.data.records import Passage
from ragsieve.errors import ModelNotAvailable, RagsieveError
from ragsieve.paths import PACKAGE_DIR
from ragsieve.rerank.base import BaseRanker, as_passages
from ragsieve.specs import EMBEDDED_RERANKERS

ASSET_DIR = PACKAGE_DIR / "assets" / EMBEDDED_RERANKERS["base"]
CARD = "ragsieve_reranker.json"
ONNX_FILE = "model.int8.onnx"


def base_reranker_dir() -> Path:
    """The shipped base cross-encoder as a CrossEncoder folder: what fine-tuning starts from."""
    if not (ASSET_DIR / "config.json").is_file():
        raise ModelNotAvailable(f"no shipped reranker in {ASSET_DIR}; reinstall ragsieve")
    return ASSET_DIR


def scoring_key(folder: str | Path, weights: str | None = None) -> str:
    """Cache key of a cross-encoder folder's scores: its weights key plus the cosine weight its card mixes in."""
    weights = weights or weights_key(folder)
    card = Path(folder) / CARD
    weight = json.loads(card.read_text()).get("cosine_weight", 0.0) if card.is_file() else 0.0
    return f"{weights}-mix{weight:g}" if weight else weights


def read_card(folder: str | Path = ASSET_DIR) -> dict:
    path = Path(folder) / CARD
    if not path.exists():
        raise ModelNotAvailable(f"no shipped reranker in {folder} (missing {CARD}); reinstall ragsieve")
    return json.loads(path.read_text())


class OnnxCrossEncoderRanker(BaseRanker):
    """A cross-encoder ONNX file (in ``folder``, or a path) + ``tokenizer.json``; score = the raw logit. Runs on
    onnxruntime, or on OpenVINO in bf16 (``engine="openvino-bf16"``, :class:`ragsieve.models.onnx.OnnxModel`).

    Example::

        OnnxCrossEncoderRanker("ragsieve/assets/base-reranker").top_k("q", ["a", "b"], 1)
    """

    name = "cross-encoder-onnx"

    def __init__(self, folder: str | Path = ASSET_DIR, onnx_file: str | Path = ONNX_FILE, max_length: int = 256,
                 batch_size: int | None = None, threads: int | None = None, engine: str = "onnxruntime"):
        from tokenizers import Tokenizer

        from ragsieve.models.onnx import ONNX_BATCH, OnnxModel

        folder = Path(folder)
        if not (folder / onnx_file).exists() or not (folder / "tokenizer.json").exists():
            raise ModelNotAvailable(f"{folder} needs {onnx_file} and tokenizer.json")
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # the file's own padding/truncation settings would pad every batch to 512
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length, strategy="longest_first")
        self.pad_id = self.tokenizer.token_to_id("[PAD]") or 0
        self.model = OnnxModel(folder / onnx_file, engine, threads)
        self.batch_size = batch_size or ONNX_BATCH
        self.max_length = max_length

    def score_pairs(self, queries: Sequence[str], passages: Sequence[Passage | str]) -> np.ndarray:
        if len(queries) != len(passages):
            raise RagsieveError(f"got {len(queries)} queries but {len(passages)} passages")
        return self.predict_pairs([(q, p.full_text) for q, p in zip(queries, as_passages(passages))])

    def window(self):
        from ragsieve.models.onnx import fast_tokenizer

        return fast_tokenizer(self.tokenizer), int(self.max_length)

    def encode_pairs(self, pairs: Sequence[tuple[str, str]]):
        return self.tokenizer.encode_batch([tuple(p) for p in pairs])

    def predict_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Raw logits for (query, passage text) tuples in input order; batches over length-sorted pairs."""
        if not pairs:
            return np.zeros(0)
        from ragsieve.models.onnx import model_batches

        out = np.zeros(len(pairs), dtype=float)
        # batch-invariant: a pair scores the same whoever it is batched with (serve batches across requests)
        for idx, feeds in model_batches(self.model, self.encode_pairs(pairs), self.batch_size, self.pad_id):
            logits = self.model(feeds)
            out[idx] = logits.reshape(len(idx), -1)[:, 0]
        return out


def load_shipped_reranker(folder: str | Path = ASSET_DIR, backend: str | None = None, threads: int | None = None,
                          batch_size: int | None = None, max_length: int | None = None,
                          cosine_backend: str | None = None) -> BaseRanker:
    """The shipped base reranker with its calibration; ``backend`` (the cross-encoder's forward) and
    ``cosine_backend`` (a mixed card's MiniLM cosine) default to the card's choices.

    ``onnx-int8`` reads the shipped ONNX file; ``openvino-bf16`` runs the weights' fp32 ONNX export
    (made once, on first use: :func:`ragsieve.rerank.fast.folder_onnx`) on OpenVINO; ``torch`` (fp32) and
    the other :mod:`ragsieve.rerank.fast` backends load the fp16 weights as a CrossEncoder. The cosine's
    ONNX backends export the encoder's weights once, on first use (:class:`ragsieve.models.encoder.OnnxEncoder`).
    """
    from ragsieve.models.cpu import cpu_backend, fast_bf16
    from ragsieve.rerank.calibration import Calibration

    card = read_card(folder)
    # bf16 pays only on CPUs with bf16 matrix units: elsewhere the card's measured choice without bf16
    fallback = {} if fast_bf16() else card.get("without_bf16", {})
    backend = cpu_backend(backend or fallback.get("default_backend") or card.get("default_backend", "onnx-int8"))
    cosine_backend = cpu_backend(cosine_backend or fallback.get("cosine_backend")
                                 or card.get("cosine_backend", "torch"))
    max_length = int(max_length or card.get("max_length", 256))
    cal = card.get("calibration")
    if backend in ("onnx-int8", "openvino-bf16"):
        from ragsieve.models.onnx import onnx_engine
        from ragsieve.rerank.fast import folder_onnx

        ranker: BaseRanker = OnnxCrossEncoderRanker(
            folder, ONNX_FILE if backend == "onnx-int8" else folder_onnx(folder), max_length=max_length,
            threads=threads, batch_size=batch_size, engine=onnx_engine(backend))
        from_probability = False
    else:
        from ragsieve.rerank.neural import CrossEncoderRanker

        if threads:
            import torch

            torch.set_num_threads(threads)
        ranker = CrossEncoderRanker(str(folder), max_length=max_length, batch_size=batch_size or 32, backend=backend)
        ranker.model.model.float()  # shipped in fp16 to halve the wheel; CPU inference runs in fp32
        from_probability = True
    weight = float(card.get("cosine_weight", 0.0))
    if weight:
        from ragsieve.rerank.mixed import CosineMixRanker

        # the mixed score is on the logit scale whatever the backends
        ranker = CosineMixRanker(ranker, weight, scale=float(card.get("cosine_scale", 20.0)),
                                 cosine_backend=cosine_backend, threads=threads)
        from_probability = False
    if cal:
        # the fit is on logits; a sigmoid-output backend maps its scores back to logits first
        ranker.calibration = Calibration(temperature=cal["temperature"], bias=cal["bias"],
                                         from_probability=from_probability)
    return ranker


def load_cross_encoder(model: str = "", max_length: int | None = None, batch_size: int | None = None,
                       backend: str | None = None, threads: int | None = None) -> BaseRanker:
    """``cross-encoder:<folder or id>``: a folder with a ragsieve card scores the way its card says.

    A folder carrying ``ragsieve_reranker.json`` (the shipped base, or a reranker fine-tuned from it
    with ``cosine_mix``) loads through :func:`load_shipped_reranker`: its cosine mix, calibration and
    backend. Any other folder or HF id is a plain :class:`~ragsieve.rerank.neural.CrossEncoderRanker`.

    Example::

        load_cross_encoder("models/aligned").rank("who wrote hamlet", ["Hamlet is by Shakespeare.", "Paris"])
    """
    if model and (Path(model) / CARD).is_file():
        return load_shipped_reranker(model, backend=backend, threads=threads, batch_size=batch_size,
                                     max_length=max_length)
    from ragsieve.rerank.neural import CrossEncoderRanker

    return CrossEncoderRanker(model, max_length=max_length or 512, batch_size=batch_size or 32,
                              backend=backend or "torch")


def embedded_reranker_dir(name: str) -> Path:
    """The asset folder of ``embedded:<name>`` (which may not exist yet: see :func:`load_embedded_reranker`)."""
    if name not in EMBEDDED_RERANKERS:
        raise ModelNotAvailable(f"unknown embedded reranker '{name}'; known: {', '.join(EMBEDDED_RERANKERS)}")
    return PACKAGE_DIR / "assets" / EMBEDDED_RERANKERS[name]


def load_embedded_reranker(name: str = "base", **kwargs) -> BaseRanker:
    """``load_reranker("embedded:base")``: a cross-encoder shipped in the package (never trains).

    Keyword arguments (``backend``, ``threads``, ``batch_size``) go to :func:`load_shipped_reranker`.

    Example::

        load_embedded_reranker("base").top_k("who wrote hamlet", ["Shakespeare wrote it.", "Paris"], 1)
    """
    folder = embedded_reranker_dir(name)
    if name == "fast" and not (folder / CARD).is_file():
        # no distilled student shipped: the default behind a cascade (the cross-encoder for the best FAST_TOP)
        from ragsieve.rerank.cascade import FAST_TOP, CascadeRanker

        return CascadeRanker(load_embedded_reranker("base", **kwargs), FAST_TOP)
    if not (folder / CARD).is_file():
        if name == "base":
            raise ModelNotAvailable(f"embedded:base is not in {folder}: reinstall ragsieve")
        # the study trains for hours and ships only a student that meets its target: say so, and what runs now
        raise ModelNotAvailable(
            f"embedded:{name} is not shipped: no student of experiments/rerank_distill.yaml has met its target yet "
            "(results/rerank_distill/README.md); use embedded:base, or bi-encoder (MiniLM cosine alone, one "
            "model) where speed matters more than quality")
    return load_shipped_reranker(folder, **kwargs)


def inherited_card(start: str | Path, max_length: int) -> dict | None:
    """The card a reranker fine-tuned from ``start`` carries so it scores as ``start`` does, or None.

    Only the scoring function is inherited (cosine weight and scale): the start's calibration
    and held-out numbers describe other weights, and there is no ONNX export, so torch it is.
    """
    path = Path(start) / CARD
    if not path.is_file():
        return None
    card = json.loads(path.read_text())
    weight = float(card.get("cosine_weight", 0.0))
    if not weight:
        return None
    return {"cosine_weight": weight, "cosine_scale": float(card.get("cosine_scale", 20.0)),
            "default_backend": "torch", "max_length": max_length, "fine_tuned_from": str(start)}


def write_asset(model_dir: str | Path, out_dir: str | Path, card: dict) -> Path:
    """Write the shipped folder from a trained fp32 CrossEncoder folder: fp16 weights, int8 ONNX, card.

    Written to a temporary sibling and renamed, so a killed export leaves the old asset intact.
    """
    import shutil
    import tempfile

    from sentence_transformers import CrossEncoder

    from ragsieve.rerank.fast import export_onnx

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    ce = CrossEncoder(str(model_dir), num_labels=1, max_length=card.get("max_length", 256), device="cpu")
    onnx_path = export_onnx(ce, str(model_dir), int8=True)  # from fp32 weights, before the fp16 cast
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        ce.model.half()
        ce.save_pretrained(str(tmp), safe_serialization=True)
        (tmp / "README.md").unlink(missing_ok=True)  # the auto model card describes a generic CrossEncoder
        shutil.copy(onnx_path, tmp / ONNX_FILE)
        (tmp / CARD).write_text(json.dumps(card, indent=2) + "\n")
        big = [p.name for p in tmp.iterdir() if p.stat().st_size > 50 * 2**20]
        if big:
            raise RagsieveError(f"asset files over 50 MB: {big}")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
