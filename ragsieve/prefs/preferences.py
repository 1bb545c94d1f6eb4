"""Confidence-shift preferences: which contexts make *this* LLM more sure it is right.

Inc(Q, C) = Conf(Q+C) − Conf(Q). Per question, the contexts with the largest positive
Inc are positives and those with the most negative Inc are negatives, written as
FlagEmbedding-style jsonl (``query, pos, neg, pos_scores, neg_scores``) for reranker
fine-tuning.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.data.stripped import TextField
from ragsieve.errors import DataError

if TYPE_CHECKING:
    from ragsieve.probe.model import ConfidenceProbe


@dataclass
class PreferenceRecord:
    """One question's preference group (FlagEmbedding fields first, ids for auditing)."""

    query: str
    pos: list[str]
    neg: list[str]
    pos_scores: list[float]
    neg_scores: list[float]
    query_id: str = ""
    pos_ids: list[str] = field(default_factory=list)
    neg_ids: list[str] = field(default_factory=list)


def confidence_shift(probe: "ConfidenceProbe", question: str, candidates: Sequence[Passage]) -> np.ndarray:
    """Inc for each candidate: Conf(Q + C_i) − Conf(Q), one batched probe call."""
    scores = probe.score_batch([question] * (len(candidates) + 1), [None, *candidates])
    return scores[1:] - scores[0]


def select_preferences(
    question: str,
    candidates: Sequence[Passage],
    inc: Sequence[float],
    *,
    n_pos: int = 5,
    n_neg: int = 5,
    question_id: str = "",
    signed: bool = True,
) -> PreferenceRecord | None:
    """Top ``n_pos`` contexts with Inc > 0 and bottom ``n_neg`` with Inc < 0; None if either side is empty.

    ``signed=False`` ranks instead: the top ``n_pos`` by Inc are positives and the bottom
    ``n_neg`` negatives whatever their sign (None only when fewer than ``n_pos + n_neg``
    candidates or no spread). For a weak LLM Conf(Q) is ≈ 0, so nearly every context raises
    confidence and the signed rule keeps almost no question (26 of 183 for SmolLM2 on NQ).

    Example::

        select_preferences("q", [Passage("a", "x"), Passage("b", "y")], [0.3, -0.1])
        # PreferenceRecord(query='q', pos=['x'], neg=['y'], pos_scores=[0.3], neg_scores=[-0.1], ...)
    """
    inc = np.asarray(inc, dtype=float)
    if len(inc) != len(candidates):
        raise DataError(f"{len(candidates)} candidates but {len(inc)} confidence shifts")
    order = np.argsort(-inc, kind="stable")  # ties keep retrieval order
    if signed:
        pos = [i for i in order if inc[i] > 0][:n_pos]
        neg = [i for i in order[::-1] if inc[i] < 0][:n_neg]
    else:
        if len(inc) < n_pos + n_neg:
            return None
        pos, neg = list(order[:n_pos]), list(order[::-1][:n_neg])
        if inc[pos[-1]] <= inc[neg[-1]]:  # no spread between the two sides
            return None
    if not pos or not neg:
        return None
    return PreferenceRecord(
        query=question,
        pos=[candidates[i].full_text for i in pos],
        neg=[candidates[i].full_text for i in neg],
        pos_scores=[float(inc[i]) for i in pos],
        neg_scores=[float(inc[i]) for i in neg],
        query_id=question_id,
        pos_ids=[candidates[i].id for i in pos],
        neg_ids=[candidates[i].id for i in neg],
    )


# what a committed preference file leaves out: the question and passage texts, joined back by id
PREFERENCE_TEXT = (TextField("query", "query_id", "question"), TextField("pos", "pos_ids", "passage"),
                   TextField("neg", "neg_ids", "passage"))


def write_preferences(path: str | Path, records: Iterable[PreferenceRecord], *, dataset: str | None = None) -> int:
    """FlagEmbedding-style jsonl; with ``dataset`` (the one the records come from) the rows are written
    stripped of their text (ids, scores and the dataset name: a copy fit to commit)."""
    from ragsieve.data import write_jsonl
    from ragsieve.data.stripped import strip_text

    rows = [asdict(r) for r in records]
    if dataset:
        rows = strip_text([{"dataset": dataset, **r} for r in rows], PREFERENCE_TEXT)
    return write_jsonl(path, rows)


_LIST_FIELDS = ("pos", "neg", "pos_scores", "neg_scores")


def read_preferences(path: str | Path, skip_bad: bool = False,
                     data_dir: str | Path | None = None) -> list[PreferenceRecord]:
    """Read FlagEmbedding-style preference jsonl; a line without usable pos/neg is an error naming it.

    Stripped rows (a committed copy, see :func:`write_preferences`) get their text back from
    their dataset under ``data_dir`` (default RAGSIEVE_DATA)."""
    from ragsieve.data import read_jsonl
    from ragsieve.data.stripped import join_text

    numbered = list(read_jsonl(path, skip_bad=skip_bad).numbered())
    joined = join_text([row for _, row in numbered], PREFERENCE_TEXT, data_dir=data_dir, where=str(path))
    numbered = [(lineno, row) for (lineno, _), row in zip(numbered, joined)]
    out = []
    for lineno, row in numbered:
        problem = _problem(row)
        if problem:
            if skip_bad:
                continue
            raise DataError(f"{path}:{lineno}: {problem}")
        pos, neg = list(row["pos"]), list(row["neg"])
        out.append(
            PreferenceRecord(
                query=row["query"], pos=pos, neg=neg,
                pos_scores=[float(x) for x in row.get("pos_scores") or [0.0] * len(pos)],
                neg_scores=[float(x) for x in row.get("neg_scores") or [0.0] * len(neg)],
                query_id=str(row.get("query_id", "")),
                pos_ids=list(row.get("pos_ids") or []), neg_ids=list(row.get("neg_ids") or []),
            )
        )
    return out


def _problem(row: dict) -> str:
    if not isinstance(row.get("query"), str) or not row["query"].strip():
        return "missing or empty 'query'"
    for key in ("pos", "neg"):
        value = row.get(key)
        if not isinstance(value, list) or not value or not all(isinstance(x, str) and x.strip() for x in value):
            return f"'{key}' must be a non-empty list of passage texts"
    for key, texts in (("pos_scores", "pos"), ("neg_scores", "neg")):
        if key in row and (not isinstance(row[key], list) or len(row[key]) != len(row[texts])):
            return f"'{key}' must list one score per '{texts}' passage"
    return ""
