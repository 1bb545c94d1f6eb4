"""What a cross-encoder's rank forward leaves behind at one layer, for a reader that carries on from there.

A keep head (:class:`~ragsieve.prune.head.SentenceKeepHead`) runs the reranker's lower layers and then its own
branch. The sieve ranks every candidate first, so the states at the branch point already exist for the passages
it keeps: :meth:`~ragsieve.rerank.neural.CrossEncoderRanker.record_states` keeps them here, per
``(query, passage text)`` pair, and the head reads them instead of running the lower layers again (issue #69:
pruning at the rank's cost).

Example::

    store = ranker.record_states(layer=4)           # the output of the 4th encoder layer, from now on
    ranker.score("who wrote hamlet?", passages)
    store.get("who wrote hamlet?", passages[0].full_text)   # (tokens, hidden) float16, or None
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: pairs kept: a query's 20 candidates many times over (float16, ≤ 256 tokens × 384: ≤ 200 kB a pair)
CAPACITY = 512


class PairStates:
    """The hidden states after encoder layer ``layer`` of the last ``capacity`` pairs a cross-encoder read,
    each unpadded ``(tokens, hidden)`` float16, keyed by ``(query, passage text)``. Safe across threads.

    ``backend``: the forward that made them (``torch`` / ``torch-bf16``), so a reader carries on in the same
    precision; ``max_length``: the window they were read in (a longer pair's states are truncated ones).
    """

    def __init__(self, layer: int, backend: str, max_length: int, capacity: int = CAPACITY):
        self.layer, self.backend, self.max_length, self.capacity = layer, backend, max_length, capacity
        self._pairs: OrderedDict[tuple[str, str], "torch.Tensor"] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, query: str, text: str, states: "torch.Tensor") -> None:
        with self._lock:
            self._pairs[(query, text)] = states
            self._pairs.move_to_end((query, text))
            while len(self._pairs) > self.capacity:
                self._pairs.popitem(last=False)

    def get(self, query: str, text: str) -> "torch.Tensor | None":
        with self._lock:
            return self._pairs.get((query, text))

    def __len__(self) -> int:
        return len(self._pairs)

    def __getstate__(self) -> dict:  # a copy (Ray, multiprocessing) starts empty: the states stay in this process
        return {k: v for k, v in self.__dict__.items() if k not in ("_pairs", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._pairs, self._lock = OrderedDict(), threading.Lock()


class LayerOutput:
    """A forward hook keeping a layer's last output, per thread (a server runs forwards on several); picklable,
    so a model carrying it still copies to a Ray worker (the copy keeps nothing)."""

    def __init__(self):
        self._local = threading.local()

    def __call__(self, module, inputs, output) -> None:
        self._local.output = output[0] if isinstance(output, tuple) else output

    def take(self) -> "torch.Tensor | None":
        """The output of this thread's last forward through the layer, once."""
        output, self._local.output = getattr(self._local, "output", None), None
        return output

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self._local = threading.local()
