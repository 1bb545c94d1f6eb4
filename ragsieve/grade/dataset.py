"""The grading dataset: each query's retrieved top-k passages, labelled relevant or not.

Queries come from several benchmarks (NQ questions, BioASQ questions, FEVER claims,
HotpotQA questions); each is run against its own dataset's passage pool with the dense
index (MiniLM + HNSW, cosine), as the lightweight-grader paper does with bge-small +
HNSW. Retrieved non-gold passages are realistic hard negatives.

Teacher labels are gold-derived by default — the passage is a gold passage / BioASQ
snippet / FEVER evidence sentence / HotpotQA supporting paragraph, or (for the sources
in ``answer_containment``) contains a gold answer — and can be replaced by an LLM
judge's (:mod:`ragsieve.grade.judge`). Splits are by query id, stratified by source and
by whether the query has any relevant passage, so no query is on both sides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ragsieve.config import StrictConfig
from ragsieve.data.records import Dataset, Question
from ragsieve.data.stripped import TextField
from ragsieve.errors import DataError, RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER


class GradingDataConfig(StrictConfig):
    """Which queries, how they are retrieved and labelled, and the split."""

    sources: list[str] = ["nq-oracle", "bioasq", "fever", "hotpotqa-distractor"]
    queries_per_source: int = 75  # 0 = every query with a gold passage
    top_k: int = 5
    retriever: str = "dense"  # the paper's setting; bm25 / hybrid also work
    encoder: str = DEFAULT_ENCODER
    # Sources where a passage that contains a gold answer also counts as relevant
    # (DPR's "has answer"); NQ answers are short spans, so this finds the many
    # relevant passages that are not the one annotated gold passage.
    answer_containment: list[str] = ["nq-oracle"]
    test_fraction: float = 0.2
    seed: int = 0
    data_dir: str | None = None
    # Only questions the shipped base reranker never trained on, so the cross-encoder grader
    # built on it is not scored on its own training queries.
    reranker_unseen: bool = False


@dataclass(frozen=True)
class GradingPair:
    """One (query, retrieved passage) example.

    ``label`` is the teacher label used for training and evaluation; ``gold_label`` is
    always the gold-derived one (they differ only under an LLM judge). ``score`` is the
    retriever's score (the cosine for the dense index).
    """

    id: str
    source: str
    query_id: str
    query: str
    passage_id: str
    passage: str
    rank: int
    score: float
    label: int
    gold_label: int
    split: str = ""

    @classmethod
    def from_row(cls, row: dict[str, Any], where: str = "row") -> "GradingPair":
        """Build from a JSON row; ``query``, ``passage`` and ``label`` are required, the rest defaults."""
        missing = [k for k in ("query", "passage", "label") if k not in row]
        if missing:
            raise DataError(f"{where}: missing field(s) {', '.join(missing)}")
        try:
            label = int(row["label"])
        except (TypeError, ValueError):
            raise DataError(f"{where}: label must be 0 or 1, got {row['label']!r}") from None
        if label not in (0, 1):
            raise DataError(f"{where}: label must be 0 or 1, got {label}")
        query_id = str(row.get("query_id") or row["query"])
        passage_id = str(row.get("passage_id") or "")
        return cls(
            id=str(row.get("id") or f"{query_id}|{passage_id or where}"),
            source=str(row.get("source", "")),
            query_id=query_id,
            query=str(row["query"]),
            passage_id=passage_id,
            passage=str(row["passage"] or ""),
            rank=int(row.get("rank", 0)),
            score=float(row.get("score", 0.0)),
            label=label,
            gold_label=int(row.get("gold_label", label)),
            split=str(row.get("split", "")),
        )


# -- gold-derived labels ----------------------------------------------------------------


def _gold_or_answer(question: Question, passage_id: str, text: str) -> int:
    from ragsieve.eval.qa import contains_answer

    return int(passage_id in question.gold_passage_ids or contains_answer(text, question.answers))


def _gold_only(question: Question, passage_id: str, text: str) -> int:
    return int(passage_id in question.gold_passage_ids)


LabelRule = Callable[[Question, str, str], int]


def label_rule(source: str, answer_containment: Sequence[str]) -> LabelRule:
    """How a source's passages are labelled: gold ids, plus answer containment if listed."""
    return _gold_or_answer if source in answer_containment else _gold_only


def select_questions(ds: Dataset, n: int, seed: int = 0, allowed: set[str] | None = None) -> list[Question]:
    """Up to ``n`` questions that have gold passages (and are ``allowed``), chosen by id hash (stable under re-ordering)."""
    from ragsieve.data.splits import id_unit

    pool = {p.id for p in ds.passages}
    usable = [q for q in ds.questions if any(pid in pool for pid in q.gold_passage_ids)
              and (allowed is None or q.id in allowed)]
    if not usable:
        raise DataError(f"dataset '{ds.name}' has no questions with gold passages in its pool; it cannot be graded")
    usable.sort(key=lambda q: (id_unit(q.id, seed), q.id))
    return usable[:n] if n > 0 else usable


def build_grading_pairs(
    config: GradingDataConfig, progress: Callable[[str], None] | None = None
) -> list[GradingPair]:
    """Retrieve the top-k for each selected query of every source and label it (gold-derived).

    Example::

        pairs = build_grading_pairs(GradingDataConfig(sources=["nq-oracle", "fever"], queries_per_source=50))
        pairs = assign_splits(pairs, test_fraction=0.2)
    """
    from ragsieve.data import load_dataset
    from ragsieve.retrieve.cached import build_or_load_index

    if len(set(config.sources)) != len(config.sources):
        raise RagsieveError(f"grading sources repeat: {config.sources}")
    pairs: list[GradingPair] = []
    for source in config.sources:
        ds = load_dataset(source, data_dir=config.data_dir)
        if not ds.passages:
            raise DataError(f"dataset '{source}' has no passage pool to retrieve from")
        allowed = None
        if config.reranker_unseen:
            from ragsieve.benchmarks.mining import unseen_question_ids

            allowed = unseen_question_ids(source, ds)
        questions = select_questions(ds, config.queries_per_source, config.seed, allowed)
        if progress:
            progress(f"{source}: indexing {len(ds.passages)} passages ({config.retriever}), {len(questions)} queries")
        retriever, _ = build_or_load_index(source, ds.passages, config.retriever, config.encoder)
        rule = label_rule(source, config.answer_containment)
        hits = retriever.search_batch([q.text for q in questions], k=config.top_k)
        for q, row in zip(questions, hits):
            query_id = f"{source}:{q.id}"
            for hit in row:
                # an empty pool sentence stays empty (graded not relevant), not "Title: "
                text = hit.passage.full_text if hit.passage.text.strip() else ""
                label = rule(q, hit.passage.id, hit.passage.text)
                pairs.append(
                    GradingPair(
                        id=f"{query_id}|{hit.passage.id}", source=source, query_id=query_id, query=q.text,
                        passage_id=hit.passage.id, passage=text, rank=hit.rank, score=float(hit.score),
                        label=label, gold_label=label,
                    )
                )
    return pairs


def apply_judge_labels(
    pairs: Sequence[GradingPair], labels: dict[str, int]
) -> tuple[list[GradingPair], int]:
    """Replace teacher labels by the judge's; pairs without a judge label are dropped (count returned)."""
    kept = [replace(p, label=int(labels[p.id])) for p in pairs if p.id in labels]
    return kept, len(pairs) - len(kept)


def assign_splits(pairs: Sequence[GradingPair], test_fraction: float = 0.2, seed: int = 0) -> list[GradingPair]:
    """Split by query id (80/20 by default), stratified by source × has-a-relevant-passage."""
    from ragsieve.data.splits import stratified_split_by_id

    stratum: dict[str, str] = {}
    for p in pairs:
        has_positive = "pos" if p.label or stratum.get(p.query_id, "").endswith("pos") else "neg"
        stratum[p.query_id] = f"{p.source}|{has_positive}"
    ids = list(stratum)
    split = stratified_split_by_id(ids, stratum, {"train": 1 - test_fraction, "test": test_fraction}, seed=seed)
    split_of = {qid: name for name, members in split.items() for qid in members}
    return [replace(p, split=split_of[p.query_id]) for p in pairs]


# -- reports ------------------------------------------------------------------------------


def _counts(pairs: Sequence[GradingPair]) -> dict[str, Any]:
    positives = sum(p.label for p in pairs)
    return {
        "pairs": len(pairs),
        "queries": len({p.query_id for p in pairs}),
        "positives": positives,
        "negatives": len(pairs) - positives,
        "positive_rate": positives / len(pairs) if pairs else None,
    }


def label_skew(pairs: Sequence[GradingPair]) -> dict[str, Any]:
    """Positive rate overall, per source and per split (the paper reports 12.3 % positives)."""
    out = _counts(pairs)
    for key in ("source", "split"):
        groups: dict[str, list[GradingPair]] = {}
        for p in pairs:
            groups.setdefault(getattr(p, key) or "-", []).append(p)
        out[f"by_{key}"] = {name: _counts(group) for name, group in sorted(groups.items())}
    by_rank: dict[int, list[GradingPair]] = {}
    for p in pairs:
        by_rank.setdefault(p.rank, []).append(p)
    out["positive_rate_by_rank"] = {str(r + 1): _counts(g)["positive_rate"] for r, g in sorted(by_rank.items())}
    return out


def plot_score_histogram(
    scores: Sequence[float], labels: Sequence[int], path: str | Path, title: str = "",
    xlabel: str = "cosine similarity (query, passage), MiniLM",
) -> Path:
    """Overlaid histograms of ``scores`` for relevant vs not-relevant pairs (the paper's Fig. 4)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scores = np.asarray(scores, dtype=float)
    labels = np.asarray(labels, dtype=int)
    fig = Figure(figsize=(6, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if len(scores):
        bins = np.linspace(scores.min(), scores.max() + 1e-9, 31)
        for value, name, colour in ((0, "not relevant", "tab:grey"), (1, "relevant", "tab:green")):
            chosen = scores[labels == value]
            if len(chosen):
                ax.hist(chosen, bins=bins, alpha=0.6, color=colour, label=f"{name} (n={len(chosen)})", density=True)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("density")
    ax.set_title(title or "Relevant vs not-relevant pairs")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


# -- files ---------------------------------------------------------------------------------


# what a committed pairs file leaves out: the query and passage texts, joined back by id from `source`
GRADING_PAIR_TEXT = (TextField("query", "query_id", "question"), TextField("passage", "passage_id", "passage"))


def write_grading_pairs(path: str | Path, pairs: Sequence[GradingPair], stripped: bool = False) -> int:
    """One pair per line; ``stripped``: without the dataset text (ids, labels, scores: a copy fit to commit)."""
    from ragsieve.data import write_jsonl
    from ragsieve.data.stripped import strip_text

    rows = [asdict(p) for p in pairs]
    return write_jsonl(path, strip_text(rows, GRADING_PAIR_TEXT) if stripped else rows)


def read_grading_pairs(path: str | Path, split: str | None = None, data_dir: str | Path | None = None
                       ) -> list[GradingPair]:
    """Read labelled pairs (``query``, ``passage``, ``label`` per line; more fields optional).

    ``split`` keeps only rows whose ``split`` field equals it. Stripped rows get their text back
    from the dataset named by their ``source`` under ``data_dir`` (default RAGSIEVE_DATA).
    """
    from ragsieve.data import read_jsonl
    from ragsieve.data.stripped import join_text

    numbered = list(read_jsonl(path).numbered())
    joined = join_text([row for _, row in numbered], GRADING_PAIR_TEXT, dataset_field="source", data_dir=data_dir,
                       where=str(path))
    pairs = [GradingPair.from_row(row, f"{path}:{lineno}") for (lineno, _), row in zip(numbered, joined)]
    if split:
        pairs = [p for p in pairs if p.split == split]
    if not pairs:
        raise DataError(f"{path}: no labelled pairs" + (f" in split '{split}'" if split else ""))
    return pairs
