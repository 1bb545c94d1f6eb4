"""The one sieve: rerank → cut to top_k → grade → keep, for one query and its passages.

Everything that filters passages goes through :class:`SieveStages`: the RAG pipeline (each
retrieved list), :meth:`~ragsieve.pipeline.sieve.Sieve.filter`, ``POST /v1/filter`` and the
framework adapters. So one fitted sieve keeps the same passages, with the same scores,
whether it is called from Python, over HTTP or inside LangChain / LlamaIndex / Haystack.

Semantics, in order:

1. **rerank** every passage (no reranker: keep the input order);
2. **cut** to the best ``top_k`` (``None``: keep all);
3. **grade** the selected passages: the grader's score against its threshold (``threshold``
   overrides it); without a grader, an explicit ``threshold`` makes the reranker its own
   grader (its scores against the threshold); with neither, nothing is graded and every
   selected passage is kept;
4. **keep** the selected passages graded relevant, best first (an empty passage never is);
5. **prune** (with a :class:`~ragsieve.prune.SentencePruner`): each kept passage is cut to its sentences
   scoring at least the prune threshold (always its best one), in their original order, under its title; or,
   with ``scope="across"``, the best sentences of all kept passages together (a sentence or token cap), a
   passage left without one dropped.

The order lives in one place, :meth:`SieveStages.plan`: a generator that yields each model call the sieve
needs (:class:`ModelCall`: rank, grade, prune) and takes back one score per pair. :meth:`SieveStages.apply`
answers them with the stages' own models; the server answers the same calls with its batched, chunked model
calls (``serve/routes/filter.py``), so both run the very same sieve.

Example::

    stages = SieveStages(load_reranker("bm25"), load_grader("graders/mine"), top_k=3)
    result = stages.apply("who wrote hamlet?", passages)
    result.kept, result.verdicts, result.trace()

    pruned = SieveStages(load_reranker("embedded:base"), top_k=1,
                         pruner=SentencePruner(load_reranker("embedded:base"), threshold=0.0))
    pruned.apply("who wrote hamlet?", passages).kept    # the best passage, cut to its useful sentences
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Generator, Sequence

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.grade.base import GradeResult, passage_texts
from ragsieve.rerank.base import BaseRanker, RankedResult, RankedResults, RetrievalOrder, as_passages, ranked_from_scores

if TYPE_CHECKING:
    from ragsieve.grade.base import Grader
    from ragsieve.prune import PrunedPassage, PruneLayout, SentencePruner


@dataclass(frozen=True)
class ModelCall:
    """Model work the sieve needs, answered with one score per passage of ``passages`` for ``query``: ``step``
    is ``"rank"`` (the reranker; a passage longer than its window by its best chunk), ``"grade"`` (the grader)
    or ``"prune"`` (the pruner's sentence scorer; ``layout`` holds the sentences of the kept passages)."""

    step: str
    query: str
    passages: tuple[Passage, ...]
    layout: "PruneLayout | None" = None


@dataclass(frozen=True)
class CandidateTrace:
    """One passage on its way to the prompt: where each stage put it."""

    id: str
    retriever_rank: int  # 0-based position in the input (the retriever's) list
    rerank_rank: int | None = None  # 0-based rank after reranking (None: no reranker)
    rerank_score: float | None = None
    selected: bool = False  # among the top_k that went on to the grader / the prompt
    relevant: bool | None = None  # the grader's verdict (None: not graded)
    grade_score: float | None = None
    # (sentence, score, kept) of a kept passage the sieve pruned; empty: not pruned
    sentences: tuple[tuple[str, float, bool], ...] = ()


@dataclass(frozen=True)
class FilterResult:
    """What a sieve decided for one query: the ranking, the top_k cut, each verdict, what to keep."""

    ranked: RankedResults  # every passage, best first (input order when nothing reranked)
    n_selected: int  # the top_k cut: ``ranked.results[:n_selected]`` went on to the grader
    verdicts: tuple[GradeResult, ...] = ()  # one per selected passage (empty: nothing graded)
    reranked: bool = True  # False: ``ranked`` is the input order, its scores mean nothing
    threshold: float | None = None  # the cut the verdicts used
    pruned: tuple["PrunedPassage", ...] = ()  # one per kept passage when pruned (empty: kept whole)
    prune_threshold: float | None = None  # the sentence cut the pruning used (raw)
    # how the pruning chose (empty when not pruned): scope ("passage" | "across"), max_sentences, token_cap
    prune_rule: tuple[tuple[str, Any], ...] = ()

    @property
    def selected_results(self) -> list[RankedResult]:
        return list(self.ranked.results[: self.n_selected])

    @property
    def selected(self) -> list[Passage]:
        """The top_k after reranking, in rank order."""
        return [r.passage for r in self.selected_results]

    @property
    def kept_results(self) -> list[tuple[RankedResult, GradeResult | None]]:
        """Each kept passage's ranking (input index, score) and verdict (None: not graded), best first."""
        if not self.verdicts:
            return [(r, None) for r in self.selected_results]
        return [(r, v) for r, v in zip(self.selected_results, self.verdicts) if v.relevant]

    @property
    def kept_whole(self) -> list[Passage]:
        """The selected passages graded relevant (all of them when nothing was graded), unpruned."""
        return [r.passage for r, _ in self.kept_results]

    @property
    def kept_items(self) -> list[tuple[RankedResult, GradeResult | None, "PrunedPassage | None"]]:
        """Each passage that reaches the prompt, best first: its ranking, verdict (None: not graded) and pruning
        (None: kept whole). The one place kept passages meet their pruned text: a passage an across-passage cut
        left without a sentence is not here."""
        if not self.pruned:
            return [(r, v, None) for r, v in self.kept_results]
        return [(r, v, p) for (r, v), p in zip(self.kept_results, self.pruned, strict=True) if p.reaches_prompt]

    @property
    def kept(self) -> list[Passage]:
        """What goes into the prompt: the kept passages, each cut to its kept sentences when pruned
        (``meta["kept_spans"]`` then says which character spans of the original text remain)."""
        return [p.as_passage() if p is not None else r.passage for r, _, p in self.kept_items]

    @property
    def tokens_before(self) -> int | None:
        """Tokens of the kept passages whole (the pruning scorer's tokenizer); None when not pruned."""
        return sum(p.tokens_before for p in self.pruned) if self.pruned else None

    @property
    def tokens_after(self) -> int | None:
        """Tokens of the kept passages after pruning; None when not pruned."""
        return sum(p.tokens_after for p in self.pruned) if self.pruned else None

    @property
    def graded_out(self) -> int:
        """Selected passages the grader dropped."""
        return self.n_selected - len(self.kept_results)

    @property
    def all_dropped(self) -> bool:
        """True when passages were graded and none is relevant: answer closed-book (and say so)."""
        return bool(self.verdicts) and not any(v.relevant for v in self.verdicts)

    def trace(self) -> list[CandidateTrace]:
        """Every passage in input order, with its rank, score, cut and verdict (what ``ask --explain`` prints)."""
        verdicts = dict(zip((r.index for r in self.selected_results), self.verdicts))
        # every pruned passage, those an across-passage cut emptied too (their sentences all show as dropped)
        pruned = {r.index: p for (r, _), p in zip(self.kept_results, self.pruned)}
        traces = []
        for r in self.ranked.results:
            selected = r.rank < self.n_selected
            verdict = verdicts.get(r.index)
            cut = pruned.get(r.index)
            sentences = tuple(zip(cut.sentences, cut.scores, cut.keep)) if cut is not None else ()
            traces.append(CandidateTrace(
                r.passage.id, r.index, r.rank if self.reranked else None, r.score if self.reranked else None,
                selected, verdict.relevant if verdict else None, verdict.score if verdict else None, sentences,
            ))
        return sorted(traces, key=lambda t: t.retriever_rank)


@dataclass(frozen=True)
class SieveStages:
    """A sieve's post-retrieval stages: reranker, top_k cut, grader, pruner (see the module doc for the order)."""

    reranker: BaseRanker | None = None  # None: keep the input order
    grader: "Grader | None" = None
    top_k: int | None = None  # None: no cut
    threshold: float | None = None  # overrides the grader's; without a grader, thresholds the reranker's scores
    pruner: "SentencePruner | None" = None  # None: kept passages stay whole

    def __post_init__(self):
        if self.top_k is not None and self.top_k < 0:  # 0: a sieve fitted to answer closed-book keeps nothing
            raise RagsieveError(f"top_k must be >= 0, got {self.top_k}")

    @classmethod
    def from_config(cls, config: Any, reranker: BaseRanker | None, grader: "Grader | None",
                    pruner_scorer: BaseRanker | None = None) -> "SieveStages":
        """The stages a sieve / pipeline config describes, on already loaded models (``pruner_scorer``: the
        sentence scorer when the config prunes with another model than its reranker).

        The one place a config's post-retrieval settings become stage settings: a new
        ``SieveConfig`` field that changes what is kept belongs here.
        """
        pruner = None
        threshold, cap = getattr(config, "prune_threshold", None), getattr(config, "prune_max_sentences", None)
        token_cap = getattr(config, "prune_token_cap", None)
        if threshold is not None or cap is not None or token_cap is not None:
            from ragsieve.prune import SentencePruner

            scorer = pruner_scorer if pruner_scorer is not None else reranker
            if scorer is None:
                raise RagsieveError("pruning needs a sentence scorer: name a reranker or a pruner")
            # a token cap holds over the kept passages together: it implies the across scope
            scope = "across" if token_cap is not None else getattr(config, "prune_scope", None) or "passage"
            if reranker is not None and hasattr(scorer, "read_rank_states"):
                scorer.read_rank_states(reranker)  # a keep head on the reranker's weights: carry on from its forward
            pruner = SentencePruner(scorer, threshold=threshold, max_sentences=cap, scope=scope, token_cap=token_cap)
        return cls(reranker, grader, top_k=config.top_k, pruner=pruner)

    def override(self, *, top_k: int | None = None, threshold: float | None = None,
                 prune_threshold: float | None = None, pruner: "SentencePruner | None" = None) -> "SieveStages":
        """The same stages with a request's own cut, threshold, pruner and/or prune threshold (``None`` keeps
        the sieve's)."""
        update = {k: v for k, v in (("top_k", top_k), ("threshold", threshold), ("pruner", pruner)) if v is not None}
        stages = replace(self, **update) if update else self
        if prune_threshold is not None:
            if stages.pruner is None:
                raise RagsieveError("no pruner configured: give the stages a SentencePruner to prune with")
            stages = replace(stages, pruner=stages.pruner.at(prune_threshold))
        return stages

    # -- the steps -------------------------------------------------------------------------------
    def rank(self, query: str, passages: Sequence[Passage | str]) -> RankedResults:
        """The passages by the reranker's score; one longer than the reranker's window scores as its best
        window-sized chunk (as ``serve``'s /v1/rerank scores documents), so its end is read too."""
        from ragsieve.rerank.chunks import reading_whole

        return reading_whole(self.reranker or RetrievalOrder()).rank(query, passages)

    def cut(self, ranked: RankedResults) -> FilterResult:
        """The top_k of a ranking, not graded yet."""
        n = len(ranked) if self.top_k is None else min(self.top_k, len(ranked))
        return FilterResult(ranked, n, reranked=self.reranker is not None)

    @property
    def grades(self) -> bool:
        """Whether anything is graded (a grader, or the reranker against an explicit threshold)."""
        return self.grader is not None or self.threshold is not None

    def grade_pairs(self, result: FilterResult) -> list[tuple[str, str]]:
        """The (query, text) pairs a grader scores for ``result``'s selected passages (empty ones as "")."""
        return [(result.ranked.query, t) for t in passage_texts(result.selected)]

    def grade(self, result: FilterResult) -> FilterResult:
        """``result`` with a verdict per selected passage (unchanged when nothing is graded)."""
        return self.run(replace(self, pruner=None).plan(result.ranked.query, selected=result))

    def decide(self, result: FilterResult, scores: Sequence[float]) -> FilterResult:
        """``result`` with a verdict per selected passage from grade ``scores`` scored elsewhere (one per
        :meth:`grade_pairs` pair): ``score >= threshold`` (the override, else the grader's)."""
        threshold = self.threshold if self.threshold is not None else self.grader.threshold
        verdicts = tuple(GradeResult.at(threshold, p.text, s) for p, s in zip(result.selected, scores))
        return replace(result, verdicts=verdicts, threshold=float(threshold))

    @property
    def prunes(self) -> bool:
        return self.pruner is not None

    def prune_layout(self, result: FilterResult) -> "PruneLayout":
        """The (query, title: sentence) pairs of ``result``'s kept passages that the pruner scores."""
        if self.pruner is None:
            raise RagsieveError("no pruner configured")
        return self.pruner.layout(result.ranked.query, result.kept_whole)

    def decide_prune(self, result: FilterResult, scores: Sequence[float]) -> FilterResult:
        """``result`` with its kept passages pruned by sentence ``scores`` scored elsewhere (one per
        :meth:`prune_layout` pair)."""
        layout = self.prune_layout(result)
        pruned = tuple(self.pruner.decide(layout, scores))
        rule = (("scope", self.pruner.scope), ("max_sentences", self.pruner.max_sentences),
                ("token_cap", self.pruner.token_cap))
        # prune_threshold None: a sentence or token cap alone
        return replace(result, pruned=pruned, prune_threshold=self.pruner.threshold, prune_rule=rule)

    def prune(self, result: FilterResult) -> FilterResult:
        """``result`` with each kept passage cut to its sentences at or above the prune threshold (unchanged
        without a pruner)."""
        return self.run(replace(self, grader=None, threshold=None).plan(result.ranked.query, selected=result))

    # -- the one order of the steps ---------------------------------------------------------------------
    def plan(self, query: str, passages: Sequence[Passage | str] = (), selected: FilterResult | None = None
             ) -> Generator[ModelCall, Sequence[float], FilterResult]:
        """Rerank → cut → grade → keep → prune as a generator: it yields each :class:`ModelCall`, is sent one
        score per pair back, and returns the :class:`FilterResult` (``selected``: start after the cut)."""
        if selected is None:
            if not isinstance(query, str) or not query.strip():
                raise RagsieveError("empty query")
            items = as_passages(passages)
            scores = (yield ModelCall("rank", query, tuple(items))) if items else []
            selected = self.cut(ranked_from_scores(query, items, scores))
        result = selected
        if self.grader is not None and self.threshold is None and not hasattr(self.grader, "score_pairs"):
            # a grader that only answers verdicts (duck-typed, no scores to batch): asked directly
            verdicts = tuple(self.grader.grade(result.ranked.query, result.selected))
            result = replace(result, verdicts=verdicts, threshold=getattr(self.grader, "threshold", None))
        elif self.grader is not None:
            texts = [t for _, t in self.grade_pairs(result)]
            scores = (yield ModelCall("grade", result.ranked.query, tuple(as_passages(texts)))) if texts else []
            result = self.decide(result, scores)
        elif self.threshold is not None:  # the reranker is its own grader
            result = self.decide(result, [r.score for r in result.selected_results])
        if self.pruner is not None and result.kept_results:
            layout = self.prune_layout(result)
            scores = (yield ModelCall("prune", result.ranked.query, layout.pairs, layout)) if layout.pairs else []
            result = self.decide_prune(result, scores)
        return result

    def score_call(self, call: ModelCall) -> np.ndarray:
        """A :class:`ModelCall` answered by the stages' own models."""
        from ragsieve.rerank.chunks import reading_whole

        if call.step == "rank":
            return np.asarray(reading_whole(self.reranker or RetrievalOrder()).score(call.query, call.passages), float)
        if call.step == "grade":
            return np.asarray(self.grader.score_pairs([call.query] * len(call.passages), call.passages), float)
        return self.pruner.score(call.layout)

    def run(self, flow: Generator[ModelCall, Sequence[float], FilterResult]) -> FilterResult:
        """Drive a :meth:`plan` with :meth:`score_call`."""
        try:
            call = next(flow)
            while True:
                call = flow.send(_checked(call, self.score_call(call)))
        except StopIteration as done:
            return done.value

    async def apply_async(self, query: str, passages: Sequence[Passage | str],
                          score_call: Callable[[ModelCall], Awaitable[Sequence[float]]]) -> FilterResult:
        """:meth:`apply` with every model call answered by ``score_call`` (awaited): how a server answers them
        batched with other requests' pairs, through the same sieve."""
        flow = self.plan(query, passages)
        # the sieve's own work between model calls (cutting, sentence splitting, token counts) runs on a worker
        # thread, so a server's event loop goes on reading other requests meanwhile
        call = await asyncio.to_thread(_advance, flow, None)
        while isinstance(call, ModelCall):
            call = await asyncio.to_thread(_advance, flow, _checked(call, await score_call(call)))
        return call

    def finish(self, selected: FilterResult) -> FilterResult:
        """Grade → keep → prune a selection (what :meth:`select` returned)."""
        return self.run(self.plan(selected.ranked.query, selected=selected))

    def select(self, query: str, passages: Sequence[Passage | str]) -> FilterResult:
        """Rerank and cut (no grading): what reaches the grader."""
        return self.cut(self.rank(query, passages))

    def apply(self, query: str, passages: Sequence[Passage | str]) -> FilterResult:
        """Rerank → cut to top_k → grade → keep → prune."""
        return self.run(self.plan(query, passages))


def _advance(flow: Generator, scores: np.ndarray | None):
    """The plan's next model call, or its result once it is done (a future cannot carry a StopIteration)."""
    try:
        return next(flow) if scores is None else flow.send(scores)
    except StopIteration as done:
        return done.value


def _checked(call: ModelCall, scores: Sequence[float]) -> np.ndarray:
    """One finite-or-not float per passage of ``call``; a scorer answering another count is a bug, said in a line."""
    scores = np.asarray(scores, dtype=float)
    if scores.shape != (len(call.passages),):
        raise RagsieveError(f"{call.step}: {scores.shape} scores for {len(call.passages)} passages")
    return scores
