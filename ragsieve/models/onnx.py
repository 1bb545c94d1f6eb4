"""onnxruntime sessions as every ragsieve ONNX model runs them (cross-encoders, bi-encoders)."""

from __future__ import annotations

from pathlib import Path

#: texts (or pairs) per onnxruntime forward. Small batches run fastest on this kind of CPU, and take less memory:
#: one thread, ≤ 128-token NQ, int8 MiniLM 97 passages/s at 8 vs 58 at 64, int8 cross-encoder 98 pairs/s at 8
#: vs 72 at 32; 256-token MultiRC passages 26 vs 20. int8 quantises activations per batch, so whoever measures
#: a backend must batch as it ships.
ONNX_BATCH = 8


def onnx_session(path: str | Path, threads: int | None = None):
    """An onnxruntime CPU session with every graph optimisation (node fusions: attention, GELU, layer norm)
    and ``threads`` intra-op threads (None/0 = onnxruntime's default, all cores). Inter-op parallelism is
    off: a cross-encoder graph is one chain, and a second pool only competes for the same cores.

    Example::

        onnx_session("ragsieve/assets/base-reranker/model.int8.onnx", threads=1).run(["logits"], feeds)
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads or 0
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
