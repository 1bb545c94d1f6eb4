"""Gold relevance data for the base cross-encoder: training groups and held-out ranking sets.

No cross-encoder reranker ships offline, so ragsieve trains its own from the gold
annotations in the benchmark data (the role bge-reranker plays in the paper):

========================  =======================================  ==========================================
source                    positives                                candidates / negatives
========================  =======================================  ==========================================
``nq-oracle``             the gold Wikipedia passage               hybrid top-20 from the pool, non-gold
``hotpotqa-distractor``   supporting paragraphs                    the question's other (distractor) paragraphs
``bioasq``                the question's gold snippets             BM25 top-20 snippets of *other* questions
``fever``                 evidence sentences                       the other sentences of the claim's documents
========================  =======================================  ==========================================

Train and held-out questions never overlap: held-out = :func:`held_out_questions`
(the split the demo and retrieval comparison use).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

from ragsieve.config import StrictConfig
from ragsieve.data.records import Dataset, Passage, Question
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.prefs.preferences import PreferenceRecord


@dataclass(frozen=True)
class RankingQuery:
    """One held-out query: its candidate list and which candidates are relevant."""

    query_id: str
    query: str
    candidates: tuple[Passage, ...]
    relevant: frozenset[str]


class RelevanceSource(StrictConfig):
    """How many train / held-out questions one dataset contributes."""

    train_questions: int = 200
    test_questions: int = 200
    positives_per_question: int = 1
    candidates: int = 20  # retrieval depth where candidates are retrieved
    test_fraction: float = 0.2


def default_sources() -> dict[str, RelevanceSource]:
    # sized so the base reranker trains in ~20 min on 2 cores (110 steps of 8 groups × 8 passages)
    return {
        "nq-oracle": RelevanceSource(train_questions=300, test_questions=200),
        # only 100 questions exist: half train the base reranker, half evaluate it
        "hotpotqa-distractor": RelevanceSource(
            train_questions=50, test_questions=50, positives_per_question=2, test_fraction=0.5
        ),
        "bioasq": RelevanceSource(train_questions=150, test_questions=200, positives_per_question=2),
        "fever": RelevanceSource(train_questions=200, test_questions=200),
    }


def split_questions(ds: Dataset, source: RelevanceSource, seed: int = 0) -> tuple[list[Question], list[Question]]:
    """(train, test) questions that have gold passages, each list capped and in id-hash order."""
    from ragsieve.data import held_out_questions

    with_gold = [q for q in ds.questions if q.gold_passage_ids]
    test = held_out_questions(with_gold, source.test_fraction, seed)
    test_ids = {q.id for q in test}
    train = [q for q in with_gold if q.id not in test_ids]
    rng = random.Random(seed)
    rng.shuffle(train)
    return train[: source.train_questions], test[: source.test_questions]


# --- candidate lists per dataset -------------------------------------------------------------


def retrieved_candidates(kind: str) -> Callable[[Dataset, Sequence[Question], int], list[list[Passage]]]:
    def candidates(ds: Dataset, questions: Sequence[Question], depth: int) -> list[list[Passage]]:
        from ragsieve.retrieve.cached import build_or_load_index

        index, _ = build_or_load_index(ds.name, ds.passages, kind, DEFAULT_ENCODER)
        hits = index.search_batch([q.text for q in questions], k=depth)
        return [[h.passage for h in row] for row in hits]

    return candidates


def _hotpot_paragraphs(ds: Dataset, questions: Sequence[Question], depth: int) -> list[list[Passage]]:
    by_id = ds.passage_by_id()
    return [[by_id[pid] for pid in q.meta["candidate_ids"]] for q in questions]


def _fever_documents(ds: Dataset, questions: Sequence[Question], depth: int) -> list[list[Passage]]:
    by_title: dict[str, list[Passage]] = {}
    for p in ds.passages:
        if p.text.strip():
            by_title.setdefault(p.title, []).append(p)
    by_id = ds.passage_by_id()
    out = []
    for q in questions:
        titles = {d.replace("_", " ") for d in q.meta.get("docids", [])}
        titles |= {by_id[pid].title for pid in q.gold_passage_ids}
        out.append([p for t in sorted(titles) for p in by_title.get(t, [])])
    return out


#: dataset → how its candidates are found
CANDIDATES: dict[str, Callable[[Dataset, Sequence[Question], int], list[list[Passage]]]] = {
    "nq-oracle": retrieved_candidates("hybrid"),
    "hotpotqa-distractor": _hotpot_paragraphs,
    "bioasq": retrieved_candidates("bm25"),
    "fever": _fever_documents,
    "multirc": retrieved_candidates("bm25"),
    "pubmedqa": retrieved_candidates("bm25"),
}


def _candidates(ds: Dataset, questions: Sequence[Question], depth: int) -> list[list[Passage]]:
    try:
        finder = CANDIDATES[ds.name]
    except KeyError:
        raise RagsieveError(f"no relevance candidates defined for '{ds.name}'; known: {', '.join(CANDIDATES)}")
    return finder(ds, questions, depth) if questions else []


def training_groups(
    ds: Dataset, questions: Sequence[Question], source: RelevanceSource, negatives: int = 7, seed: int = 0
) -> list[PreferenceRecord]:
    """Gold passages as ``pos``, non-gold candidates as ``neg`` (questions without negatives dropped)."""
    by_id = ds.passage_by_id()
    rng = random.Random(seed)
    records = []
    for q, cands in zip(questions, _candidates(ds, questions, source.candidates)):
        gold = set(q.gold_passage_ids)
        gold_texts = {by_id[g].full_text for g in gold}
        # a non-gold candidate with the same text as a gold one is not a negative
        neg = [c for c in cands if c.id not in gold and c.full_text not in gold_texts]
        if not neg:
            continue
        pos_ids = rng.sample(sorted(gold), min(len(gold), source.positives_per_question))
        neg = rng.sample(neg, min(len(neg), negatives))
        records.append(
            PreferenceRecord(
                query=q.text,
                pos=[by_id[p].full_text for p in pos_ids],
                neg=[c.full_text for c in neg],
                pos_scores=[1.0] * len(pos_ids),
                neg_scores=[0.0] * len(neg),
                query_id=q.id,
                pos_ids=pos_ids,
                neg_ids=[c.id for c in neg],
            )
        )
    return records


def ranking_queries(ds: Dataset, questions: Sequence[Question], source: RelevanceSource) -> list[RankingQuery]:
    """Held-out ranking sets; candidates keep their retrieval order (BM25 / retriever ties)."""
    return [
        RankingQuery(q.id, q.text, tuple(cands), frozenset(q.gold_passage_ids))
        for q, cands in zip(questions, _candidates(ds, questions, source.candidates))
        if cands
    ]


def evaluate_rankers(
    rankers: dict[str, "BaseRanker"],  # noqa: F821 - typing only
    queries: Sequence[RankingQuery],
    ks: Sequence[int] = (1, 3, 5, 10),
    measures: Sequence[str] = ("P", "R", "MRR", "nDCG"),
) -> dict[str, dict[str, float]]:
    """Ranking metrics of each ranker over the same candidate lists (ranx via :func:`ranking_metrics`).

    Queries whose candidates contain no relevant passage still count (as misses for
    every ranker), so the numbers are comparable across rankers.

    Example::

        evaluate_rankers({"bm25": load_reranker("bm25")}, queries)["bm25"]["MRR@10"]
    """
    from ragsieve.eval.ranking import ranking_metrics

    qrels = _qrels(queries)
    return {name: ranking_metrics(qrels, _run(ranker, queries), ks=ks, measures=measures)
            for name, ranker in rankers.items()}


def _qrels(queries: Sequence[RankingQuery]) -> dict[str, dict[str, int]]:
    return {q.query_id: {pid: 1 for pid in q.relevant} for q in queries}


def _run(ranker: "BaseRanker", queries: Sequence[RankingQuery]) -> dict[str, dict[str, float]]:  # noqa: F821
    """The ranker's order of each query's candidates as a ranx run."""
    run = {}
    for q in queries:
        ranked = ranker.rank(q.query, list(q.candidates))
        # distinct scores by rank so ranx cannot reorder ties differently from rank();
        # a repeated passage keeps its best rank
        docs: dict[str, float] = {}
        for r in ranked.results:
            docs.setdefault(r.passage.id, float(len(ranked) - r.rank))
        run[q.query_id] = docs
    return run


def per_query(
    ranker: "BaseRanker",  # noqa: F821 - typing only
    queries: Sequence[RankingQuery],
    ks: Sequence[int] = (10,),
    measures: Sequence[str] = ("MRR", "nDCG"),
) -> dict[str, dict[str, float]]:
    """``{"MRR@10": {qid: v}, "nDCG@10": {...}}``: each query's metrics over its candidate list (ranx).

    The per-query values behind :func:`evaluate_rankers`' means, for intervals and paired tests.

    Example::

        per_query(load_reranker("bm25"), queries)["MRR@10"]        # {"q1": 1.0, "q2": 0.5, ...}
        per_query(ranker, queries, ks=(1, 3), measures=("P",))      # {"P@1": {...}, "P@3": {...}}
    """
    from ragsieve.eval.ranking import ranking_metrics

    return ranking_metrics(_qrels(queries), _run(ranker, queries), ks=ks, measures=measures, per_query=True)
