"""The rerankers' rankings of each question's candidates, scored once per fit run and kept across runs.

The relevance check (align), the grade threshold and the selection all read the same rankings: a
cross-encoder pass over every candidate is the costly part. Scores are kept in
``<records or work>/scores/<sha1 of the scorer's key>`` (:class:`~ragsieve.data.score_records.PairScores`),
so a resumed fit re-ranks nothing.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Sequence

from ragsieve.data.records import Question

if TYPE_CHECKING:
    from ragsieve.fit.state import FitState


class Rankings:
    """Loaded rerankers, their rankings by question and their score stores, for one fit run."""

    def __init__(self, state: "FitState"):
        self.state = state
        self._rankers: dict[str, Any] = {}  # reranker spec → loaded reranker
        self._rankings: dict[str, dict[str, list[tuple[int, float]]]] = {}  # spec → question id → ranking
        self._score_stores: dict[str, Any] = {}  # spec → PairScores of its candidate scores, or None

    def ranker(self, spec: str):
        """Reranker ``spec`` (``reranker``: the sieve's aligned folder), loaded once."""
        from ragsieve.registry import load_reranker

        if spec not in self._rankers:
            self._rankers[spec] = load_reranker(self.state.ranker_base(spec))
        return self._rankers[spec]

    def rank_all(self, specs: Sequence[str], questions: Sequence[Question], phase: str) -> None:
        """Rank every question's candidates with each of ``specs`` (memoized by :meth:`ranked`), reporting
        progress under ``phase``: minutes of cross-encoder passes a log under nohup would otherwise not show."""
        todo = [(spec, q) for spec in specs for q in questions
                if q.id not in self._rankings.get(spec, {})]
        if todo:  # the first report is read as what a resumed phase found done: "N to do" first
            self.state.progress(phase, 0, len(todo))
        for n, (spec, q) in enumerate(todo, 1):
            self.ranked(spec, q)
            self.state.progress(phase, n, len(todo))

    def ranked(self, spec: str, q: Question) -> list[tuple[int, float]]:
        """``q``'s candidates as (index, score) in the order of reranker ``spec`` (``reranker``: the sieve's
        aligned folder), scored once per fit run."""
        from ragsieve.rerank.base import ranked_from_scores

        memo = self._rankings.setdefault(spec, {})
        if q.id not in memo:
            candidates = self.state.candidates[q.id]
            store = self.score_store(spec)
            ids = [p.id for p in candidates]
            scores = store.lookup(q.id, ids) if store is not None and candidates else None
            if scores is None and candidates:
                scores = [float(s) for s in self.ranker(spec).score(q.text, candidates)]
                if store is not None:
                    store.add([(q.id, pid, s) for pid, s in zip(ids, scores)])
            ranked = ranked_from_scores(q.text, candidates, scores).results if candidates else []
            memo[q.id] = [(r.index, float(r.score)) for r in ranked]
        return memo[q.id]

    def score_store(self, spec: str):
        """Where ``spec``'s candidate scores are kept across runs, keyed by its weights and reading (a passage
        past the window by its best chunk, as ``load_reranker`` scores it): a resumed selection re-ranks
        nothing (≈ 40 min for 845 questions and two rerankers on 2 cores). None for a scorer without local
        weights (its scores are not kept)."""
        from ragsieve.data.score_records import PairScores
        from ragsieve.registry import reranker_scores_key

        if spec not in self._score_stores:
            key = reranker_scores_key(self.state.ranker_base(spec))
            self._score_stores[spec] = None if key is None else PairScores(
                self.state.scores_root() / hashlib.sha1(key.encode()).hexdigest()[:16], "candidates",
                {"scoring_key": key})
        return self._score_stores[spec]
