"""ONNX graphs as every ragsieve ONNX model runs them (cross-encoders, bi-encoders): on onnxruntime, or on
OpenVINO in bf16, which on a CPU with AMX runs a MiniLM-size model ≈ 1.5× faster than torch's bf16 autocast."""

from __future__ import annotations

import logging
import threading
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

log = logging.getLogger(__name__)

#: engines an ONNX file runs on: onnxruntime (fp32 or int8 files), or OpenVINO with bf16 matrix products
#: (fp32 weights and accumulation; f32 on a CPU without bf16 matrix units, see ragsieve.models.cpu.fast_bf16)
ENGINES = ("onnxruntime", "openvino-bf16")


def onnx_engine(backend: str) -> str:
    """The engine an ONNX backend name runs on: ``openvino-bf16`` on OpenVINO, ``onnx`` / ``onnx-int8`` on
    onnxruntime."""
    return "openvino-bf16" if backend == "openvino-bf16" else "onnxruntime"

#: texts (or pairs) per ONNX forward. Small batches run fastest on this kind of CPU, and take less memory: one
#: thread, ≤ 128-token NQ, int8 MiniLM 97 passages/s at 8 vs 58 at 64, int8 cross-encoder 98 pairs/s at 8 vs 72 at
#: 32; 256-token MultiRC passages 26 vs 20; OpenVINO bf16 cross-encoder at ≤ 512 tokens 20.7 vs 17.1. int8 quantises
#: activations per batch, so whoever measures a backend must batch as it ships.
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


class OnnxModel:
    """One ONNX graph on an :data:`ENGINES` engine: ``model(feeds)`` is its first output for a dict of int64
    arrays (extra keys are dropped; :attr:`inputs` names the graph's own). Safe to call from several threads.
    :attr:`batch_invariant` is False for a dynamically quantised (int8) graph: run its inputs one at a time, unpadded.
    ``throughput=True`` compiles OpenVINO for bulk work (one stream per core, :meth:`run_batches` keeps each busy):
    ≈ 1.2-1.6× the texts/s of one latency stream on 2 cores, at a higher latency per call.

    Example::

        model = OnnxModel("model.onnx", engine="openvino-bf16", threads=1)
        logits = model({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    """

    def __init__(self, path: str | Path, engine: str = "onnxruntime", threads: int | None = None,
                 throughput: bool = False):
        if engine not in ENGINES:
            raise ValueError(f"unknown ONNX engine '{engine}'; known: {', '.join(ENGINES)}")
        self.path, self.engine, self.throughput = Path(path), engine, throughput and engine != "onnxruntime"
        self.batch_invariant = not _quantises_per_batch(path)
        if engine == "onnxruntime":
            self._session = onnx_session(path, threads)
            self.inputs = {i.name for i in self._session.get_inputs()}
            self._output = self._session.get_outputs()[0].name
            return
        import openvino as ov

        from ragsieve.errors import ModelNotAvailable
        from ragsieve.models.cpu import fast_bf16, jemalloc_loaded

        if jemalloc_loaded():  # OpenVINO would abort the whole process at compile time
            raise ModelNotAvailable(f"{engine} cannot run in a process with jemalloc loaded (LD_PRELOAD): "
                                    "use backend torch-bf16, or run without jemalloc")

        precision = "bf16" if fast_bf16() else "f32"
        if precision == "f32":
            log.info("openvino-bf16 needs a CPU with AMX or AVX512-BF16; running OpenVINO in f32")
        # LATENCY: one stream on the given threads, as one ranker call runs; THROUGHPUT (bulk encoding): one stream
        # per core, fed by run_batches; 0 threads = OpenVINO's default
        self._compiled = ov.Core().compile_model(str(path), "CPU", {
            "INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "THROUGHPUT" if self.throughput else "LATENCY",
            "INFERENCE_NUM_THREADS": int(threads or 0)})
        self.inputs = {name for port in self._compiled.inputs for name in port.get_names()}
        self._requests = threading.local()  # an infer request serves one call at a time

    def __call__(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        feeds = {k: v for k, v in feeds.items() if k in self.inputs}
        if self.engine == "onnxruntime":
            return self._session.run([self._output], feeds)[0]
        request = getattr(self._requests, "request", None)
        if request is None:
            request = self._requests.request = self._compiled.create_infer_request()
        return np.array(request.infer(feeds)[0])  # a copy: the request reuses its output buffer

    def run_batches(self, batches: Iterable[tuple[Any, dict[str, np.ndarray]]]) -> list[tuple[Any, np.ndarray]]:
        """``(key, first output)`` of every ``(key, feeds)`` batch, in any order: side by side, one per stream,
        on a throughput-compiled OpenVINO model; else one after the other."""
        if not self.throughput:
            return [(key, self(feeds)) for key, feeds in batches]
        import openvino as ov

        done: list[tuple[Any, np.ndarray]] = []
        queue = ov.AsyncInferQueue(self._compiled, 0)  # 0: as many requests as the model has streams
        queue.set_callback(lambda request, key: done.append((key, np.array(request.get_output_tensor(0).data))))
        for key, feeds in batches:
            queue.start_async({k: v for k, v in feeds.items() if k in self.inputs}, key)
        queue.wait_all()
        return done


#: rows are padded to a multiple of this many tokens and only rows of one padded width share a batch, so a pair's
#: score never depends on its batchmates: bf16 kernels (torch autocast, OpenVINO) give a row different results at
#: different padded widths (0.5219 vs 0.5187 for one pair), never at different batch sizes of one width
PAD_BUCKET = 8


def bucketed_batches(lengths: Sequence[int], batch_size: int, bucket: int = PAD_BUCKET) -> Iterator[np.ndarray]:
    """Indices per batch, shortest first, every batch of one padded width (``lengths`` rounded up to ``bucket``).

    Example::

        list(bucketed_batches([3, 9, 5, 16], 8))   # [array([0, 2]), array([1, 3])]: widths 8 and 16
    """
    widths = -(-np.asarray(lengths, dtype=np.int64) // bucket) * bucket
    order = np.argsort(widths, kind="stable")
    for width in np.unique(widths):
        same = order[widths[order] == width]
        for lo in range(0, len(same), batch_size):
            yield same[lo: lo + batch_size]


def _quantises_per_batch(path: str | Path) -> bool:
    """True for a dynamically quantised graph: its int8 activations are scaled by the whole batch's range, so a
    row's result depends on its batchmates (and on padding) whatever the widths."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return any(node.op_type == "DynamicQuantizeLinear" for node in graph.node)


def model_batches(model: "OnnxModel", encodings: Sequence, batch_size: int,
                  pad_id: int = 0) -> Iterator[tuple[np.ndarray, dict]]:
    """:func:`padded_batches` as ``model`` runs them batch-invariantly: length buckets, or one unpadded input per
    call for a graph that quantises per batch."""
    if model.batch_invariant:
        return padded_batches(encodings, batch_size, pad_id)
    return padded_batches(encodings, 1, pad_id, bucket=1)


def padded_batches(encodings: Sequence, batch_size: int, pad_id: int = 0,
                   bucket: int = PAD_BUCKET) -> Iterator[tuple[np.ndarray, dict]]:
    """``(indices, feeds)`` per batch of ``tokenizers`` encodings (:func:`bucketed_batches`: shortest first, one
    padded width per batch): ``input_ids`` (padded with ``pad_id``), ``attention_mask`` and ``token_type_ids`` as
    int64 arrays, the indices saying which inputs the rows are (results go back to input order by them).

    Example::

        for idx, feeds in padded_batches(tokenizer.encode_batch(texts), 8):
            out[idx] = session.run(None, feeds)[0][:, 0]
    """
    for idx in bucketed_batches([len(e.ids) for e in encodings], batch_size, bucket):
        width = -(-max(len(encodings[i].ids) for i in idx) // bucket) * bucket
        feeds = {k: np.full((len(idx), width), pad_id if k == "input_ids" else 0, dtype=np.int64)
                 for k in ("input_ids", "attention_mask", "token_type_ids")}
        for row, i in enumerate(idx):
            n = len(encodings[i].ids)
            feeds["input_ids"][row, :n] = encodings[i].ids
            feeds["attention_mask"][row, :n] = 1
            feeds["token_type_ids"][row, :n] = encodings[i].type_ids
        yield idx, feeds


@lru_cache(maxsize=8)
def fast_tokenizer(tokenizer: "Tokenizer") -> "PreTrainedTokenizerFast":
    """A Hugging Face fast tokenizer over a copy of a ``tokenizers.Tokenizer``, made once per tokenizer (the copy:
    transformers resets truncation and padding on the tokenizer it wraps, which would undo the ranker's own)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer.to_str()))
