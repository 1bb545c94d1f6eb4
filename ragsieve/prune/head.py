"""A sentence keep head on the reranker's own forward (Provence-style): one forward per passage, not per sentence.

Zero-shot pruning scores every ``(query, title: sentence)`` pair with the reranker: one forward per sentence,
and each sentence read without the passage around it. :class:`SentenceKeepHead` reads ``(query, title: passage)``
once. The shipped cross-encoder's lower layers (frozen: its rerank logit does not change) carry the pair up to
the branch point; a :class:`~ragsieve.prune.branch.KeepBranch` — a trained copy of the top layers and a linear
token classifier — scores every token, and a sentence's keep logit is the mean over its tokens. The branch is
trained on sentence labels (HotpotQA supporting facts, the NQ sentences holding the answer, FEVER evidence
sentences) by :class:`~ragsieve.prune.training.KeepHeadTrainer` (``ragsieve run experiments/prune_head.yaml``)
and ships as ``prune_head.safetensors`` beside the cross-encoder.

A :class:`~ragsieve.prune.pruner.SentencePruner` uses it through :meth:`SentenceKeepHead.score_layout`; the
head is a :class:`~ragsieve.rerank.base.BaseRanker` too, so scoring a lone (query, sentence) pair also works
(the sentence is then the whole passage).

Example::

    head = SentenceKeepHead()                          # the shipped cross-encoder + its keep head
    pruner = SentencePruner(head, threshold=0.0)       # a threshold on the head's logit
    [p.text for p in pruner.prune("who wrote hamlet?", passages)]
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.errors import ModelNotAvailable
from ragsieve.rerank.base import BaseRanker, as_passages

if TYPE_CHECKING:
    import torch

    from ragsieve.prune.branch import BertBranch, KeepBranch
    from ragsieve.prune.pruner import PruneLayout
    from ragsieve.rerank.neural import CrossEncoderRanker

HEAD_FILE = "prune_head.safetensors"
HEAD_FORMAT = "keep-branch-1"


def _default_folder() -> Path:
    from ragsieve.rerank.shipped import ASSET_DIR

    return ASSET_DIR


@dataclass
class TrunkStates:
    """One passage read by the frozen trunk: its tokens' hidden states at the branch point, and the sentence
    each token belongs to (-1: query, title, special tokens)."""

    states: "torch.Tensor"  # (tokens, hidden), float16 to keep many of them in memory while training
    sentence_of_token: np.ndarray
    n_sentences: int


class SentenceKeepHead(BaseRanker):
    """The cross-encoder in ``folder`` read token by token up to the branch point, and its keep branch.

    ``head``: a :class:`~ragsieve.prune.branch.KeepBranch` to use instead of ``folder``'s
    ``prune_head.safetensors``. ``folder`` may also be a keep head's file kept elsewhere (a fitted sieve's,
    :mod:`ragsieve.fit.sentences`): it then runs on the shipped cross-encoder, whose weights it must have been
    trained on. :meth:`untrained` gives a head to train.
    """

    name = "prune-head"

    def __init__(self, folder: str | Path | None = None, head: "KeepBranch | None" = None,
                 max_length: int = 512, batch_size: int = 8):
        head_file = None
        if folder is not None and Path(folder).is_file():
            head_file, folder = Path(folder), None
        self.folder = Path(folder) if folder is not None else _default_folder()
        if not (self.folder / "config.json").is_file():
            raise ModelNotAvailable(f"prune head: no cross-encoder in {self.folder}")
        if head is None:
            head = read_head(head_file or self.folder / HEAD_FILE, self.folder)
        self.branch = head
        self._load_trunk(len(self.branch.layers))
        self.branch.eval()
        self.max_length, self.batch_size = max_length, batch_size
        self.rank: "CrossEncoderRanker | None" = None  # the reranker whose forward leaves this head's trunk states
        self.precision = "torch"  # the forward's backend: fp32, or the reranker's (torch-bf16) once reading it
        self.serving_branch: "BertBranch | None" = None  # the branch as BERT layers, once reading the rank's states
        # cross-encoders this head cannot carry on from: the stages are built per request (/v1/filter), and each
        # check reads two weights files
        self._refused: "weakref.WeakSet[CrossEncoderRanker]" = weakref.WeakSet()

    @classmethod
    def untrained(cls, folder: str | Path | None = None, branch_layers: int = 2, **kwargs: Any) -> SentenceKeepHead:
        """A head whose branch is a copy of the cross-encoder's top ``branch_layers`` layers and a zero
        classifier: what :class:`~ragsieve.prune.training.KeepHeadTrainer` starts from."""
        from ragsieve.prune.branch import KeepBranch

        bert = _read_bert(Path(folder) if folder is not None else _default_folder())
        if not 0 <= branch_layers < bert.config.num_hidden_layers:
            raise ModelNotAvailable(f"prune head: branch_layers must be in [0, {bert.config.num_hidden_layers})")
        return cls(folder, head=KeepBranch.from_bert(bert, branch_layers), **kwargs)

    def _load_trunk(self, branch_layers: int) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
        self.encoder = _read_bert(self.folder)
        # the trunk stops at the branch point: the branch replaces the top layers, so they are not run
        kept = len(self.encoder.encoder.layer) - branch_layers
        self.encoder.encoder.layer = self.encoder.encoder.layer[:kept]

    # -- the forward --------------------------------------------------------------------------------
    def read_rank_states(self, ranker: BaseRanker) -> bool:
        """Carry on from ``ranker``'s own forward where it is this head's cross-encoder (same weights) on a torch
        backend: a passage the sieve ranked is then read by the branch alone, from the states the rank left at
        the branch point (pruning costs the branch's layers, not a second read of the passage), in the rank's
        precision. A passage longer than the rank's window is read by this head's own trunk, as before. False
        (nothing changes) for any other ranker."""
        from ragsieve.artifacts import weights_key

        cross = _cross_encoder_in(ranker)
        if cross is None or cross in self._refused:
            return False
        if cross is self.rank:
            return True
        if (not Path(cross.model_dir).is_dir() or weights_key(cross.model_dir) != weights_key(self.folder)
                or cross.record_states(len(self.encoder.encoder.layer)) is None):
            self._refused.add(cross)
            return False
        self.rank, self.precision = cross, cross.backend
        self.serving_branch = self.branch.as_bert(self.encoder.config)  # its weights as they are now: inference only
        return True

    def trunk_states(self, query: str | Sequence[str], passages: Sequence[Passage],
                     spans: Sequence[Sequence[tuple[int, int]]]) -> list[TrunkStates]:
        """Each passage read as ``(query, title: passage)`` up to the branch point, batched, with the sentence
        (a span of character offsets into ``passage.text``) each token falls in. A sentence past the window
        has no token. ``query``: one for all passages, or one per passage. With :meth:`read_rank_states`, the
        states come from the reranker's forward (run now for a pair it has not read)."""
        import torch

        from ragsieve.models.cpu import autocast

        queries = [query] * len(passages) if isinstance(query, str) else list(query)
        out: list[TrunkStates | None] = ([None] * len(passages) if self.rank is None
                                         else self._from_rank(queries, passages, spans))
        todo = [i for i, read in enumerate(out) if read is None]
        for lo in range(0, len(todo), self.batch_size):
            batch = todo[lo: lo + self.batch_size]
            texts = [passages[i].full_text for i in batch]
            enc = self.tokenizer([queries[i] for i in batch], texts, truncation="only_second",
                                 max_length=self.max_length, padding=True, return_offsets_mapping=True,
                                 return_tensors="pt")
            offsets = enc.pop("offset_mapping").numpy()
            with torch.inference_mode(), autocast(self.precision):
                states = self.encoder(**enc).last_hidden_state
            lengths = enc["attention_mask"].sum(1).tolist()
            for j, i in enumerate(batch):
                n = lengths[j]
                index = _sentence_of_token(enc.sequence_ids(j), offsets[j], passages[i], spans[i])
                out[i] = TrunkStates(states[j, :n].to(torch.float16).clone(), index[:n], len(spans[i]))
        return out

    def _from_rank(self, queries: Sequence[str], passages: Sequence[Passage],
                   spans: Sequence[Sequence[tuple[int, int]]]) -> list[TrunkStates | None]:
        """The trunk states the reranker's forward left for each pair that fits its window (read now if it has
        not read it yet); None for the others."""
        store = self.rank.states
        texts = [p.full_text for p in passages]
        enc = self.tokenizer(list(queries), texts, truncation="only_second", max_length=self.max_length,
                             return_offsets_mapping=True)
        fits = [i for i, ids in enumerate(enc["input_ids"]) if len(ids) <= store.max_length]
        unread = [(queries[i], texts[i]) for i in fits if store.get(queries[i], texts[i]) is None]
        if unread:
            self.rank.predict_logits(unread)  # records their states
        out: list[TrunkStates | None] = [None] * len(passages)
        for i in fits:
            states = store.get(queries[i], texts[i])
            if states is None or len(states) != len(enc["input_ids"][i]):  # evicted meanwhile, or read otherwise
                continue
            index = _sentence_of_token(enc.sequence_ids(i), np.asarray(enc["offset_mapping"][i]), passages[i],
                                       spans[i])
            out[i] = TrunkStates(states, index, len(spans[i]))
        return out

    def sentence_logits(self, read: Sequence[TrunkStates]) -> list[np.ndarray]:
        """Each passage's sentence keep logits from its trunk states (-inf: a sentence past the window)."""
        import torch

        from ragsieve.models.cpu import autocast
        from ragsieve.prune.branch import sentence_logits

        out: list[np.ndarray] = []
        for lo in range(0, len(read), self.batch_size):
            part = read[lo: lo + self.batch_size]
            with torch.inference_mode(), autocast(self.precision):
                got = sentence_logits(self.serving_branch or self.branch, [r.states for r in part],
                                      [r.sentence_of_token for r in part],
                                      [r.n_sentences for r in part])
            out += [g.numpy().astype(np.float64) for g in got]
        return out

    # -- what a SentencePruner calls -----------------------------------------------------------------
    def score_layout(self, layout: "PruneLayout") -> np.ndarray:
        """One keep logit per sentence pair of ``layout``, each passage read whole in one forward."""
        if not layout.pairs:
            return np.zeros(0)
        logits = self.sentence_logits(self.trunk_states(layout.query, layout.passages, layout.spans))
        return np.concatenate(logits) if logits else np.zeros(0)

    def score(self, query: str, passages: Sequence[Passage | str]) -> np.ndarray:
        """A passage's keep logit read as one sentence (what scoring a lone (query, sentence) pair means here)."""
        items = as_passages(passages)
        read = self.trunk_states(query, items, [[(0, len(p.text))] for p in items])
        return np.array([float(s[0]) for s in self.sentence_logits(read)])

    def save(self, path: str | Path) -> None:
        """Write this head's branch as ``path`` (``prune_head.safetensors`` beside its cross-encoder ships it)."""
        write_head(path, self.branch, self.folder)


@dataclass(frozen=True, eq=False)
class SentenceInPassage:
    """Sentence ``k`` (of ``spans``) of ``passage``: a sentence scored by a keep head in its passage's context."""

    passage: Passage
    spans: tuple[tuple[int, int], ...]
    k: int

    def __len__(self) -> int:  # what a server's batcher counts a pair's cost by
        start, end = self.spans[self.k]
        return end - start


def sentences_in_passages(layout: "PruneLayout") -> list[tuple[str, SentenceInPassage]]:
    """One ``(query, sentence)`` pair per sentence pair of ``layout``, in its order, each holding its passage."""
    return [(layout.query, SentenceInPassage(p, tuple(spans), k))
            for p, spans in zip(layout.passages, layout.spans) for k in range(len(spans))]


class HeadSentences(BaseRanker):
    """A keep head as a pair scorer over :class:`SentenceInPassage` s: one call scores the sentences of many
    requests, each passage read whole once (batched by the head), so a server batches the head across
    requests as it batches the reranker's pairs.

    Example::

        HeadSentences(head).score_pairs(*zip(*sentences_in_passages(layout)))   # == head.score_layout(layout)
    """

    name = "prune-head-sentences"

    def __init__(self, head: SentenceKeepHead):
        self.head = head

    def score_pairs(self, queries: Sequence[str], sentences: Sequence[SentenceInPassage]) -> np.ndarray:
        read: dict[tuple[str, int], int] = {}  # (query, passage) -> its place in the one batched read
        queries_read, passages, spans, where = [], [], [], []
        for query, sentence in zip(queries, sentences):
            key = (query, id(sentence.passage))
            if key not in read:
                read[key] = len(passages)
                queries_read.append(query)
                passages.append(sentence.passage)
                spans.append(sentence.spans)
            where.append((read[key], sentence.k))
        logits = self.head.sentence_logits(self.head.trunk_states(queries_read, passages, spans)) if passages else []
        return np.array([logits[i][k] for i, k in where], dtype=float)


def _sentence_of_token(sequence_ids: Sequence[int | None], offsets: np.ndarray, passage: Passage,
                       spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """The sentence (its index in ``spans``, character offsets into ``passage.text``) each token of a
    ``(query, title: passage)`` encoding falls in; -1 for the query, the title and special tokens."""
    shift = len(passage.full_text) - len(passage.text)  # the title prefix before the passage's own text
    sequence = np.array([-1 if s is None else s for s in sequence_ids])
    starts, ends = offsets[: len(sequence), 0] - shift, offsets[: len(sequence), 1] - shift
    index = np.full(len(sequence), -1, dtype=np.int32)
    for k, (a, b) in enumerate(spans):
        index[(sequence == 1) & (ends > a) & (starts < b) & (ends > starts)] = k
    return index


def _cross_encoder_in(ranker: BaseRanker) -> "CrossEncoderRanker | None":
    """The cross-encoder a ranker's score comes from, through its wrappers (best chunk, cosine mix)."""
    from ragsieve.rerank.neural import CrossEncoderRanker

    for _ in range(4):
        if isinstance(ranker, CrossEncoderRanker):
            return ranker
        ranker = getattr(ranker, "cross", None) or getattr(ranker, "ranker", None)
    return None


def _read_bert(folder: Path):
    import torch
    from transformers import AutoModel

    from ragsieve.models.quiet import quiet_transformers

    with quiet_transformers():  # the encoder alone: the reranker's classifier is expected to go unused
        model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    if model.config.model_type != "bert":
        raise ModelNotAvailable(f"prune head: {folder} is a {model.config.model_type}, the keep branch copies "
                                f"BERT layers")
    return model


def read_head(path: str | Path, folder: str | Path) -> "KeepBranch":
    """The keep branch in ``path``, trained on the cross-encoder in ``folder`` (refused for other weights)."""
    from safetensors import safe_open
    from transformers import AutoConfig

    from ragsieve.artifacts import weights_key
    from ragsieve.prune.branch import KeepBranch

    if not Path(path).is_file():
        raise ModelNotAvailable(f"no prune head at {path}: train one with `ragsieve run experiments/prune_head.yaml`")
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if meta.get("format") != HEAD_FORMAT:
        raise ModelNotAvailable(f"{path}: not a keep branch ({HEAD_FORMAT}); retrain it with "
                                f"`ragsieve run experiments/prune_head.yaml`")
    if meta.get("encoder") != weights_key(folder):
        raise ModelNotAvailable(f"{path} was trained on other cross-encoder weights than {folder}'s")
    branch = KeepBranch.like(AutoConfig.from_pretrained(folder), int(meta["branch_layers"]))
    branch.load_state_dict({k: v.float() for k, v in tensors.items()})
    return branch.eval()


def write_head(path: str | Path, branch: "KeepBranch", folder: str | Path) -> None:
    """Save a keep branch (float16) with the key of the cross-encoder weights it reads."""
    import torch
    from safetensors.torch import save_file

    from ragsieve.artifacts import weights_key
    from ragsieve.atomic import atomic_file

    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in branch.state_dict().items()}
    meta = {"format": HEAD_FORMAT, "branch_layers": str(len(branch.layers)), "encoder": weights_key(folder)}
    with atomic_file(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
