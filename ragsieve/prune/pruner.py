"""Sentence pruning: keep only the sentences of a passage that the query needs.

A sieve keeps or drops whole passages; the answer to a question usually sits in one of their
sentences. :class:`SentencePruner` splits each kept passage into sentences
(:func:`~ragsieve.prune.sentences.split_sentences`), scores every ``(query, title: sentence)`` pair with a
:class:`~ragsieve.rerank.base.BaseRanker` (zero-shot: the sieve's reranker), and keeps the sentences
scoring at or above ``threshold`` (raw, on the scorer's scale, as a sieve's ``sieve.json`` stores it),
always at least the best one of each passage, in their original order under the passage's title.

The steps are split like :class:`~ragsieve.pipeline.stages.SieveStages`' grading so a caller that
batches its model calls elsewhere (the server) prunes the same way:
``decide(layout, scores of layout.pairs)``.

Example::

    pruner = SentencePruner(load_reranker("embedded:base"), threshold=0.0)
    [p.text for p in pruner.prune("who wrote hamlet?", passages)]
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.prune.sentences import DEFAULT_LANGUAGE, split_sentences
from ragsieve.rerank.base import BaseRanker

TokenCounter = Callable[[str], int]


def whitespace_tokens(text: str) -> int:
    """Words between white space: the count used when the scorer has no tokenizer."""
    return len(text.split())


class TokenizerCounter:
    """Tokens of a text in a Hugging Face tokenizer (no special tokens); :meth:`many` counts a list in one call."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def many(self, texts: Sequence[str]) -> list[int]:
        ids = self.tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"] if texts else []
        return [len(i) for i in ids]


def token_counts(count: TokenCounter, texts: Sequence[str]) -> list[int]:
    """``count`` of each text, in one batch where the counter can (a tokenizer's, in Rust)."""
    many = getattr(count, "many", None)
    return many(texts) if many is not None else [count(t) for t in texts]


def scorer_token_counter(scorer: BaseRanker) -> TokenCounter:
    """Token counts in the scorer's own tokenizer (the shipped reranker's WordPiece; a keep head's, the same),
    words if it has none."""
    window = scorer.window()
    tokenizer = window[0] if window is not None else getattr(scorer, "tokenizer", None)
    if tokenizer is None:
        return whitespace_tokens
    return TokenizerCounter(tokenizer)


#: where the keep rule looks: each passage's own sentences, or every sentence of the kept passages at once
SCOPES = ("passage", "across")


@dataclass(frozen=True)
class PrunedPassage:
    """One passage after pruning: every sentence's span and score, which were kept, and the text that remains.

    ``spans`` index ``passage.text``; ``text`` joins the kept sentences with the original separator where they
    were adjacent and a space across a dropped one.
    """

    passage: Passage  # as it came in, whole
    spans: tuple[tuple[int, int], ...]
    scores: tuple[float, ...]
    keep: tuple[bool, ...]
    tokens_before: int = 0
    tokens_after: int = 0

    @property
    def kept_spans(self) -> list[tuple[int, int]]:
        return [s for s, k in zip(self.spans, self.keep) if k]

    @property
    def sentences(self) -> list[str]:
        return [self.passage.text[a:b] for a, b in self.spans]

    @property
    def text(self) -> str:
        if not self.spans:
            return self.passage.text
        source, parts, last = self.passage.text, [], None
        for i, ((a, b), k) in enumerate(zip(self.spans, self.keep)):
            if not k:
                continue
            if parts:
                parts.append(source[self.spans[i - 1][1]:a] if last == i - 1 else " ")
            parts.append(source[a:b])
            last = i
        return "".join(parts)

    @property
    def n_kept(self) -> int:
        return int(sum(self.keep))

    @property
    def reaches_prompt(self) -> bool:
        """False when an across-passage cut kept none of its sentences: the passage leaves the prompt."""
        return self.n_kept > 0 or not self.spans

    def as_passage(self) -> Passage:
        """The pruned passage: same id and title, the kept text; ``meta["kept_spans"]`` says where it came from."""
        if self.n_kept == len(self.spans):
            return self.passage
        meta = {**self.passage.meta, "kept_spans": [list(s) for s in self.kept_spans]}
        return Passage(self.passage.id, self.text, self.passage.title, meta)


@dataclass(frozen=True)
class PruneLayout:
    """The sentence pairs of a list of passages, and which passage each came from (see :meth:`SentencePruner.layout`)."""

    query: str
    passages: tuple[Passage, ...]
    spans: tuple[tuple[tuple[int, int], ...], ...]  # per passage
    pairs: tuple[Passage, ...] = field(default=())  # one per sentence of every passage, in order

    @property
    def texts(self) -> list[str]:
        """The scored text of each pair (``title: sentence``), for a caller that scores strings."""
        return [p.full_text for p in self.pairs]


@dataclass(frozen=True)
class SentencePruner:
    """Keeps the sentences of each passage scoring at least ``threshold`` with ``scorer`` (see the module doc).

    ``scope="passage"`` (the default) cuts each passage on its own: its ``min_keep`` best sentences always stay,
    so a kept passage never empties; ``max_sentences`` keeps at most that many (the best ones) of those at or
    above the threshold, so a long passage of on-topic sentences still shrinks (with no threshold: simply the
    best ``max_sentences``). ``scope="across"`` ranks every sentence of every kept passage together (RECOMP /
    EXIT's extractive selection): the best ``max_sentences`` of them in all, and/or as many of the best as fit
    in ``token_cap`` tokens, those at or above the threshold, always the ``min_keep`` best overall; a passage
    none of whose sentences is kept leaves the prompt, so evidence in two passages costs two sentences, not
    two passages. Tokens (before, after and against ``token_cap``) are counted with ``count_tokens`` (default:
    the scorer's tokenizer).
    """

    scorer: BaseRanker
    threshold: float | None = None  # raw, on the scorer's scale; None: a caller must give one (or a cap)
    min_keep: int = 1
    max_sentences: int | None = None  # per passage, or in all with scope="across"
    language: str = DEFAULT_LANGUAGE
    count_tokens: TokenCounter | None = None
    scope: str = "passage"
    token_cap: int | None = None  # scope="across": the kept sentences' tokens in all, at most

    def __post_init__(self):
        if self.min_keep < 1:
            raise RagsieveError(f"min_keep must be >= 1, got {self.min_keep}")
        if self.max_sentences is not None and self.max_sentences < self.min_keep:
            raise RagsieveError(f"max_sentences must be >= min_keep ({self.min_keep}), got {self.max_sentences}")
        if self.threshold is not None and np.isnan(self.threshold):  # +inf is fine: the best sentence only
            raise RagsieveError("prune threshold must be a number, got NaN")
        if self.scope not in SCOPES:
            raise RagsieveError(f"prune scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")
        if self.token_cap is not None and (self.token_cap < 1 or self.scope != "across"):
            raise RagsieveError(f"a prune token cap is >= 1 and needs scope='across', got {self.token_cap} "
                                f"with scope={self.scope!r}")

    def at(self, threshold: float | None, max_sentences: int | None = None, *, scope: str | None = None,
           token_cap: int | None = None) -> "SentencePruner":
        """The same pruner at another threshold, sentence cap, scope and/or token cap (``None`` keeps this one's)."""
        update = {k: v for k, v in (("threshold", threshold), ("max_sentences", max_sentences), ("scope", scope),
                                    ("token_cap", token_cap)) if v is not None}
        return replace(self, **update) if update else self

    def layout(self, query: str, passages: Sequence[Passage]) -> PruneLayout:
        """Every sentence of every passage as a ``(title, sentence)`` passage to score against ``query``."""
        spans = tuple(split_sentences(p.text, self.language) for p in passages)
        pairs = tuple(Passage(f"{p.id}#{a}-{b}", p.text[a:b], p.title)
                      for p, ss in zip(passages, spans) for a, b in ss)
        return PruneLayout(query, tuple(passages), spans, pairs)

    def score(self, layout: PruneLayout) -> np.ndarray:
        """The scorer's score of each sentence pair of ``layout``: a scorer that reads whole passages (a keep head,
        :class:`~ragsieve.prune.head.SentenceKeepHead`) scores them in one forward per passage."""
        if not layout.pairs:
            return np.zeros(0)
        if hasattr(self.scorer, "score_layout"):
            return np.asarray(self.scorer.score_layout(layout), float)
        return np.asarray(self.scorer.score_pairs([layout.query] * len(layout.pairs), list(layout.pairs)), float)

    def score_many(self, layouts: Sequence[PruneLayout]) -> list[np.ndarray]:
        """:meth:`score` of each layout: a pair scorer's pairs of every layout in one batch, a keep head's
        passages read whole (a sentence scored alone would lose the passage it sits in)."""
        if hasattr(self.scorer, "score_layout"):
            return [self.score(layout) for layout in layouts]
        queries = [layout.query for layout in layouts for _ in layout.pairs]
        pairs = [p for layout in layouts for p in layout.pairs]
        flat = np.asarray(self.scorer.score_pairs(queries, pairs), float) if pairs else np.zeros(0)
        bounds = np.cumsum([0] + [len(layout.pairs) for layout in layouts])
        return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def decide(self, layout: PruneLayout, scores: Sequence[float], threshold: float | None = None
               ) -> list[PrunedPassage]:
        """Each passage pruned by sentence ``scores`` (one per ``layout.pairs``) against ``threshold``
        (default: this pruner's), one :class:`PrunedPassage` per passage (with ``scope="across"`` one may keep
        nothing: it leaves the prompt)."""
        threshold = self._threshold(threshold)
        scores = np.asarray(scores, dtype=float)
        if len(scores) != len(layout.pairs):
            raise RagsieveError(f"{len(scores)} sentence scores for {len(layout.pairs)} sentences")
        count = self.count_tokens or scorer_token_counter(self.scorer)
        bounds = np.cumsum([0] + [len(spans) for spans in layout.spans])
        if self.scope == "across":
            keep = self._keep_across(layout, scores, threshold, count)
        else:
            keep = np.concatenate([self._keep_within(scores[a:b], threshold) for a, b in zip(bounds[:-1], bounds[1:])]
                                  or [np.zeros(0, bool)])
        out = [PrunedPassage(passage, spans, tuple(float(s) for s in scores[a:b]), tuple(bool(k) for k in keep[a:b]))
               for passage, spans, a, b in zip(layout.passages, layout.spans, bounds[:-1], bounds[1:])]
        counts = token_counts(count, [p.passage.text for p in out] + [p.text for p in out])
        return [replace(p, tokens_before=before, tokens_after=after)
                for p, before, after in zip(out, counts[: len(out)], counts[len(out):])]

    def _keep_within(self, own: np.ndarray, threshold: float) -> np.ndarray:
        """One passage's rule: at or above the threshold, at most ``max_sentences``, always ``min_keep``."""
        keep = own >= threshold
        best_first = np.argsort(-own, kind="stable")
        if self.max_sentences is not None:
            keep[best_first[self.max_sentences:]] = False
        if len(own):  # the best min_keep always stay: a kept passage never empties
            keep[best_first[: self.min_keep]] = True
        return keep

    def _keep_across(self, layout: PruneLayout, scores: np.ndarray, threshold: float, count: TokenCounter
                     ) -> np.ndarray:
        """Every sentence ranked together: the best first while the sentence cap and the token cap allow
        (a sentence too long for what is left of the cap is passed over for a shorter one below it), those at
        or above the threshold, always the ``min_keep`` best overall."""
        keep = np.zeros(len(scores), bool)
        kept, left = 0, self.token_cap
        for rank, i in enumerate(np.argsort(-scores, kind="stable")):  # ties: the earlier passage and sentence
            forced = rank < self.min_keep
            if not forced and (scores[i] < threshold or (self.max_sentences is not None and kept >= self.max_sentences)
                               or (left is not None and left < 1)):  # a sentence holds a token at least
                break
            cost = count(layout.pairs[i].text) if left is not None else 0
            if forced or left is None or cost <= left:
                keep[i] = True
                kept += 1
                left = None if left is None else left - cost
        return keep

    def prune(self, query: str, passages: Sequence[Passage], threshold: float | None = None) -> list[PrunedPassage]:
        """Split, score and cut ``passages`` for ``query`` in one call."""
        threshold = self._threshold(threshold)  # before any model call
        layout = self.layout(query, passages)
        return self.decide(layout, self.score(layout), threshold)

    def _threshold(self, threshold: float | None) -> float:
        threshold = self.threshold if threshold is None else threshold
        if threshold is None:
            if self.max_sentences is not None or self.token_cap is not None:
                return float("-inf")  # a cap alone: the best sentences, whatever they score
            raise RagsieveError("no prune threshold: give one (raw, on the pruning scorer's scale), max_sentences or "
                                "token_cap")
        return float(threshold)
