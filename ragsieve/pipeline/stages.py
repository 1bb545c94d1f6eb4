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
4. **keep** the selected passages graded relevant, best first (an empty passage never is).

The steps are separate methods so a caller that scores elsewhere (the server batches and
chunks its model calls) still applies the same cut and the same verdicts:
``decide(cut(ranked_from_scores(...)), grade scores of grade_pairs(...))``.

Example::

    stages = SieveStages(load_reranker("bm25"), load_grader("graders/mine"), top_k=3)
    result = stages.apply("who wrote hamlet?", passages)
    result.kept, result.verdicts, result.trace()
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Sequence

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.grade.base import GradeResult, passage_texts
from ragsieve.rerank.base import BaseRanker, RankedResult, RankedResults, RetrievalOrder

if TYPE_CHECKING:
    from ragsieve.grade.base import Grader


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


@dataclass(frozen=True)
class FilterResult:
    """What a sieve decided for one query: the ranking, the top_k cut, each verdict, what to keep."""

    ranked: RankedResults  # every passage, best first (input order when nothing reranked)
    n_selected: int  # the top_k cut: ``ranked.results[:n_selected]`` went on to the grader
    verdicts: tuple[GradeResult, ...] = ()  # one per selected passage (empty: nothing graded)
    reranked: bool = True  # False: ``ranked`` is the input order, its scores mean nothing
    threshold: float | None = None  # the cut the verdicts used

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
    def kept(self) -> list[Passage]:
        """The selected passages graded relevant (all of them when nothing was graded)."""
        return [r.passage for r, _ in self.kept_results]

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
        traces = []
        for r in self.ranked.results:
            selected = r.rank < self.n_selected
            verdict = verdicts.get(r.index)
            traces.append(CandidateTrace(
                r.passage.id, r.index, r.rank if self.reranked else None, r.score if self.reranked else None,
                selected, verdict.relevant if verdict else None, verdict.score if verdict else None,
            ))
        return sorted(traces, key=lambda t: t.retriever_rank)


@dataclass(frozen=True)
class SieveStages:
    """A sieve's post-retrieval stages: reranker, top_k cut, grader (see the module doc for the order)."""

    reranker: BaseRanker | None = None  # None: keep the input order
    grader: "Grader | None" = None
    top_k: int | None = None  # None: no cut
    threshold: float | None = None  # overrides the grader's; without a grader, thresholds the reranker's scores

    def __post_init__(self):
        if self.top_k is not None and self.top_k < 0:  # 0: a sieve fitted to answer closed-book keeps nothing
            raise RagsieveError(f"top_k must be >= 0, got {self.top_k}")

    @classmethod
    def from_config(cls, config: Any, reranker: BaseRanker | None, grader: "Grader | None") -> "SieveStages":
        """The stages a sieve / pipeline config describes, on already loaded models.

        The one place a config's post-retrieval settings become stage settings: a new
        ``SieveConfig`` field that changes what is kept belongs here.
        """
        return cls(reranker, grader, top_k=config.top_k)

    def override(self, *, top_k: int | None = None, threshold: float | None = None) -> "SieveStages":
        """The same stages with a request's own cut and/or threshold (``None`` keeps the sieve's)."""
        update = {k: v for k, v in (("top_k", top_k), ("threshold", threshold)) if v is not None}
        return replace(self, **update) if update else self

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
        if self.grader is not None and self.threshold is None:  # the grader's own verdicts
            verdicts = tuple(self.grader.grade(result.ranked.query, result.selected))
            return replace(result, verdicts=verdicts, threshold=getattr(self.grader, "threshold", None))
        if self.grader is not None:
            pairs = self.grade_pairs(result)
            return self.decide(result, self.grader.score_pairs([q for q, _ in pairs], [t for _, t in pairs]))
        if self.threshold is not None:  # the reranker is its own grader
            return self.decide(result, [r.score for r in result.selected_results])
        return result

    def decide(self, result: FilterResult, scores: Sequence[float]) -> FilterResult:
        """``result`` with a verdict per selected passage from grade ``scores`` scored elsewhere (one per
        :meth:`grade_pairs` pair): ``score >= threshold`` (the override, else the grader's)."""
        threshold = self.threshold if self.threshold is not None else self.grader.threshold
        verdicts = tuple(GradeResult.at(threshold, p.text, s) for p, s in zip(result.selected, scores))
        return replace(result, verdicts=verdicts, threshold=float(threshold))

    def select(self, query: str, passages: Sequence[Passage | str]) -> FilterResult:
        """Rerank and cut (no grading): what reaches the grader."""
        return self.cut(self.rank(query, passages))

    def apply(self, query: str, passages: Sequence[Passage | str]) -> FilterResult:
        """Rerank → cut to top_k → grade → keep."""
        return self.grade(self.select(query, passages))
