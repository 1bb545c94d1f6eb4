"""Faster cross-encoder inference on CPU: the same tokenised inputs, a cheaper forward.

Inputs come from the CrossEncoder's own ``preprocess`` (so tokenisation, truncation and
pair order are exactly what ``CrossEncoder.predict`` uses); only the forward pass
changes:

* ``torch-bf16`` — bf16 autocast (fp32 weights and accumulation): ≈ 2.8× fp32 on a CPU with AMX, logits
  within ≈ 0.01 of fp32 (:func:`ragsieve.models.cpu.fast_bf16` says whether this CPU has it).
* ``torch-int8`` — ``torch.ao.quantization.quantize_dynamic`` on every ``nn.Linear``.
* ``onnx`` / ``onnx-int8`` — ``torch.onnx.export`` (TorchScript exporter: the dynamo one
  breaks ``quantize_dynamic``) run by onnxruntime; int8 is per-channel dynamic
  quantisation, which keeps rankings much closer to fp32 than per-tensor.
* ``openvino-bf16`` — the fp32 ONNX export on OpenVINO with bf16 matrix products: on a CPU with AMX,
  ≈ 1.5× ``torch-bf16`` at ≤ 128 tokens (179 vs 114 pairs/s, one thread), logits within ≈ 0.09 of fp32.

The ONNX files are cached under ``$RAGSIEVE_CACHE/onnx/<weights digest>/``. Whether a
backend keeps quality is measured, not assumed: ``bench/rerank.py`` reports nDCG@10
against fp32 for each one.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from ragsieve.atomic import atomic_file
from ragsieve.errors import RagsieveError
from ragsieve.models.onnx import OnnxModel, onnx_engine
from ragsieve.paths import cache_dir

if TYPE_CHECKING:
    from sentence_transformers import CrossEncoder

#: backend name → forward function factory ``(cross_encoder, model_dir) -> (features -> logits)``
Forward = Callable[[dict], np.ndarray]


def _torch_forward(backend: str) -> Callable[["CrossEncoder", str], Forward]:
    """``torch`` in fp32, ``torch-bf16`` the same under bf16 autocast (:func:`ragsieve.models.cpu.autocast`)."""
    def factory(ce: "CrossEncoder", model_dir: str) -> Forward:
        import torch

        from ragsieve.models.cpu import autocast

        def forward(features: dict) -> np.ndarray:
            with torch.inference_mode(), autocast(backend):
                return ce.model(**features).logits.float().numpy()

        return forward

    return factory


def _torch_int8_forward(ce: "CrossEncoder", model_dir: str) -> Forward:
    import copy

    import torch

    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(ce.model).eval(), {torch.nn.Linear},
                                                       dtype=torch.qint8)

    def forward(features: dict) -> np.ndarray:
        with torch.inference_mode():
            return quantized(**features).logits.float().numpy()

    return forward


def _onnx_forward(backend: str) -> Callable[["CrossEncoder", str], Forward]:
    def factory(ce: "CrossEncoder", model_dir: str) -> Forward:
        import torch

        path = export_onnx(ce, model_dir, int8=backend == "onnx-int8")
        model = OnnxModel(path, onnx_engine(backend), torch.get_num_threads())

        def forward(features: dict) -> np.ndarray:
            return model({k: v.numpy().astype(np.int64) for k, v in features.items() if k in model.inputs})

        return forward

    return factory


BACKENDS: dict[str, Callable[["CrossEncoder", str], Forward]] = {
    "torch": _torch_forward("torch"),
    "torch-bf16": _torch_forward("torch-bf16"),  # fp32 weights, bf16 matmuls: pays only on AMX / AVX512-BF16 CPUs
    "torch-int8": _torch_int8_forward,
    "onnx": _onnx_forward("onnx"),
    "onnx-int8": _onnx_forward("onnx-int8"),
    "openvino-bf16": _onnx_forward("openvino-bf16"),  # pays on AMX / AVX512-BF16 CPUs
}


def make_forward(backend: str, ce: "CrossEncoder", model_dir: str) -> Forward:
    try:
        factory = BACKENDS[backend]
    except KeyError:
        raise RagsieveError(f"unknown cross-encoder backend '{backend}'; known: {', '.join(BACKENDS)}") from None
    return factory(ce, model_dir)


def _weights_digest(ce: "CrossEncoder") -> str:
    """Digest of the weights themselves, so a retrained folder at the same path gets a new export."""
    h = hashlib.sha1()
    for name, tensor in sorted(ce.model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().numpy().tobytes()[:4096])
        h.update(str(tuple(tensor.shape)).encode())
    return h.hexdigest()[:16]


def folder_onnx(model_dir: str | Path) -> Path:
    """The fp32 ONNX export of a cross-encoder folder, keyed by its weights file: a cached export loads
    without torch; a missing one loads the folder (in fp32) once to export it."""
    from ragsieve.artifacts import weights_key

    folder = cache_dir() / "onnx" / f"cross-encoder-{weights_key(model_dir)}"
    if (folder / "model.onnx").is_file():
        return folder / "model.onnx"
    import torch
    from sentence_transformers import CrossEncoder

    ce = CrossEncoder(str(model_dir), device="cpu", model_kwargs={"dtype": torch.float32})
    return export_onnx(ce, str(model_dir), folder=folder)


def export_onnx(ce: "CrossEncoder", model_dir: str, int8: bool = False, folder: Path | None = None) -> Path:
    """Export (once) the cross-encoder's sequence classifier to ONNX, into ``folder`` (default: keyed by a
    digest of the loaded weights); optionally int8 per-channel."""
    import torch
    from filelock import FileLock

    folder = folder or cache_dir() / "onnx" / _weights_digest(ce)
    fp32, q8 = folder / "model.onnx", folder / "model.int8.onnx"
    target = q8 if int8 else fp32
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / ".lock")):
        if not fp32.exists():
            model = ce.model.eval()

            class LogitsOnly(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.inner = model

                def forward(self, input_ids, attention_mask, token_type_ids):
                    return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                                      token_type_ids=token_type_ids).logits

            sample = ce.preprocess([("a query", "a passage to score")])
            args = tuple(sample[k] for k in ("input_ids", "attention_mask", "token_type_ids"))
            dynamic = {n: {0: "batch", 1: "sequence"} for n in ("input_ids", "attention_mask", "token_type_ids")}
            dynamic["logits"] = {0: "batch"}
            with atomic_file(fp32) as tmp:
                torch.onnx.export(
                    LogitsOnly(), args, str(tmp), input_names=["input_ids", "attention_mask", "token_type_ids"],
                    output_names=["logits"], dynamic_axes=dynamic, opset_version=17, dynamo=False,
                )
        if int8 and not q8.exists():
            from onnxruntime.quantization import QuantType, quantize_dynamic

            with atomic_file(q8) as tmp:
                quantize_dynamic(str(fp32), str(tmp), per_channel=True, weight_type=QuantType.QInt8)
    return target
