"""A sentence keep head on the reranker's own forward (Provence-style): one forward per passage, not per sentence.

Zero-shot pruning scores every ``(query, title: sentence)`` pair with the reranker: one forward per sentence,
and each sentence read without the passage around it. :class:`SentenceKeepHead` reads ``(query, title: passage)``
once through the shipped cross-encoder (the same weights, frozen: its rerank logit does not change) and scores
each sentence by a linear layer over its tokens' hidden states averaged over the sentence — the last layer's,
a middle layer's, and the last layer's multiplied elementwise by the query's mean state and by the pair's
``[CLS]`` state, so the head weighs a sentence against the question it is read with (linear in the token
states for a given query, so the average of token logits is the logit of the averaged features). The layer is
trained on sentence
labels (HotpotQA supporting facts, the NQ sentences holding the answer, FEVER evidence sentences) by
``ragsieve run experiments/prune_head.yaml``; its weights ship as ``prune_head.safetensors`` beside the
cross-encoder.

A :class:`~ragsieve.prune.pruner.SentencePruner` uses it through :meth:`SentenceKeepHead.score_layout`; the
head is a :class:`~ragsieve.rerank.base.BaseRanker` too, so scoring a lone (query, sentence) pair also works
(the sentence is then the whole passage).

Example::

    head = SentenceKeepHead()                          # the shipped cross-encoder + its keep head
    pruner = SentencePruner(head, threshold=0.0)       # a threshold on the head's logit
    [p.text for p in pruner.prune("who wrote hamlet?", passages)]
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.errors import ModelNotAvailable
from ragsieve.rerank.base import BaseRanker, as_passages

if TYPE_CHECKING:
    from ragsieve.prune.pruner import PruneLayout

HEAD_FILE = "prune_head.safetensors"
#: the blocks of a sentence's features, each ``hidden_size`` wide, in the order the head's weight reads them
FEATURE_BLOCKS = ("last", "middle", "last*query", "last*cls")


def _default_folder() -> Path:
    from ragsieve.rerank.shipped import ASSET_DIR

    return ASSET_DIR


class SentenceKeepHead(BaseRanker):
    """The cross-encoder in ``folder`` read token by token, and a linear keep head over its last hidden states.

    ``head``: ``(weight, bias)`` to use instead of ``folder``'s ``prune_head.safetensors``; ``"untrained"`` for
    training, which only needs :meth:`sentence_features`.
    """

    name = "prune-head"

    def __init__(self, folder: str | Path | None = None, head: "tuple[np.ndarray, float] | str | None" = None,
                 max_length: int = 512, batch_size: int = 8):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.folder = Path(folder) if folder is not None else _default_folder()
        if not (self.folder / "config.json").is_file():
            raise ModelNotAvailable(f"prune head: no cross-encoder in {self.folder}")
        if head is None:
            head = read_head(self.folder / HEAD_FILE)
        self.weight, self.bias = (None, 0.0) if head == "untrained" else (np.asarray(head[0], np.float32),
                                                                          float(head[1]))
        from ragsieve.models.quiet import quiet_transformers

        self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
        with quiet_transformers():  # the encoder alone: the reranker's classifier is expected to go unused
            self.encoder = AutoModel.from_pretrained(self.folder, dtype=torch.float32).eval()
        self.max_length, self.batch_size = max_length, batch_size

    # -- the forward --------------------------------------------------------------------------------
    def sentence_features(self, query: str, passages: Sequence[Passage],
                          spans: Sequence[Sequence[tuple[int, int]]]) -> list[np.ndarray]:
        """Per passage, one row per sentence span (character offsets into ``passage.text``): the sentence's
        features (:data:`FEATURE_BLOCKS`), read in one forward of ``(query, title: passage)``. A sentence past
        the window (truncated) gets a row of NaN."""
        import torch

        out: list[np.ndarray] = []
        for lo in range(0, len(passages), self.batch_size):
            batch = list(passages[lo: lo + self.batch_size])
            texts = [p.full_text for p in batch]
            enc = self.tokenizer([query] * len(batch), texts, truncation="only_second", max_length=self.max_length,
                                 padding=True, return_offsets_mapping=True, return_tensors="pt")
            offsets = enc.pop("offset_mapping").numpy()
            with torch.inference_mode():
                hidden = self.encoder(**enc, output_hidden_states=True).hidden_states
            last, middle = hidden[-1].numpy(), hidden[len(hidden) // 2].numpy()
            for j, (passage, text) in enumerate(zip(batch, texts)):
                shift = len(text) - len(passage.text)  # the title prefix before the passage's own text
                sequence = np.array([-1 if s is None else s for s in enc.sequence_ids(j)])
                query_state, cls_state = last[j, sequence == 0].mean(0), last[j, 0]
                starts, ends = offsets[j, :, 0] - shift, offsets[j, :, 1] - shift
                rows = []
                for a, b in spans[lo + j]:
                    tokens = (sequence == 1) & (ends > a) & (starts < b) & (ends > starts)
                    if not tokens.any():
                        rows.append(np.full(4 * last.shape[-1], np.nan))
                        continue
                    own = last[j, tokens].mean(0)
                    rows.append(np.concatenate([own, middle[j, tokens].mean(0), own * query_state, own * cls_state]))
                out.append(np.asarray(rows, dtype=np.float32).reshape(len(rows), 4 * last.shape[-1]))
        return out

    def logits(self, features: np.ndarray) -> np.ndarray:
        """The head's keep logit of each sentence's features; a truncated sentence (NaN) scores -inf."""
        if self.weight is None:
            raise ModelNotAvailable("this keep head is untrained: load one, or give head=(weight, bias)")
        scores = features @ self.weight + self.bias
        return np.where(np.isnan(scores), -np.inf, scores)

    # -- what a SentencePruner calls -----------------------------------------------------------------
    def score_layout(self, layout: "PruneLayout") -> np.ndarray:
        """One keep logit per sentence pair of ``layout``, each passage read whole in one forward."""
        if not layout.pairs:
            return np.zeros(0)
        features = self.sentence_features(layout.query, layout.passages, layout.spans)
        return np.concatenate([self.logits(f) for f in features]) if features else np.zeros(0)

    def score(self, query: str, passages: Sequence[Passage | str]) -> np.ndarray:
        """A passage's keep logit read as one sentence (what scoring a lone (query, sentence) pair means here)."""
        items = as_passages(passages)
        features = self.sentence_features(query, items, [[(0, len(p.text))] for p in items])
        return np.array([float(self.logits(f)[0]) for f in features])


def read_head(path: str | Path) -> tuple[np.ndarray, float]:
    """``(weight, bias)`` of a keep head file."""
    from safetensors.numpy import load_file

    if not Path(path).is_file():
        raise ModelNotAvailable(f"no prune head at {path}: train one with `ragsieve run experiments/prune_head.yaml`")
    tensors = load_file(str(path))
    return tensors["weight"].reshape(-1), float(tensors["bias"].reshape(-1)[0])


def write_head(path: str | Path, weight: np.ndarray, bias: float) -> None:
    """Save a keep head as safetensors (``weight`` over :data:`FEATURE_BLOCKS` × the hidden size, ``bias``)."""
    from safetensors.numpy import save_file

    save_file({"weight": np.asarray(weight, np.float32).reshape(-1), "bias": np.array([bias], np.float32)},
              str(path))
