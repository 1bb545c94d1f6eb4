"""onnxruntime sessions as every ragsieve ONNX model runs them (cross-encoders, bi-encoders)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

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


def padded_batches(encodings: Sequence, batch_size: int, pad_id: int = 0) -> Iterator[tuple[np.ndarray, dict]]:
    """``(indices, feeds)`` per batch of ``tokenizers`` encodings, shortest first so each batch pads little:
    ``input_ids`` (padded with ``pad_id``), ``attention_mask`` and ``token_type_ids`` as int64 arrays, the
    indices saying which inputs the rows are (results go back to input order by them).

    Example::

        for idx, feeds in padded_batches(tokenizer.encode_batch(texts), 8):
            out[idx] = session.run(None, feeds)[0][:, 0]
    """
    order = np.argsort([len(e.ids) for e in encodings], kind="stable")
    for lo in range(0, len(order), batch_size):
        idx = order[lo: lo + batch_size]
        width = max(len(encodings[i].ids) for i in idx)
        feeds = {k: np.full((len(idx), width), pad_id if k == "input_ids" else 0, dtype=np.int64)
                 for k in ("input_ids", "attention_mask", "token_type_ids")}
        for row, i in enumerate(idx):
            n = len(encodings[i].ids)
            feeds["input_ids"][row, :n] = encodings[i].ids
            feeds["attention_mask"][row, :n] = 1
            feeds["token_type_ids"][row, :n] = encodings[i].type_ids
        yield idx, feeds
