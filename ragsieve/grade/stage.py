"""The grader as a pipeline stage: keep the passages graded relevant, say when none are left."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ragsieve.data.records import Passage
from ragsieve.grade.base import GradeResult, Grader


@dataclass
class GradeFilterResult:
    """The passages kept (input order), every verdict, and whether all were dropped."""

    kept: list[Passage]
    results: list[GradeResult] = field(default_factory=list)

    @property
    def dropped(self) -> int:
        return len(self.results) - len(self.kept)

    @property
    def all_dropped(self) -> bool:
        """True when there were passages and none is relevant: answer closed-book (and say so)."""
        return bool(self.results) and not self.kept


def grade_filter(grader: Grader, query: str, passages: Sequence[Passage]) -> GradeFilterResult:
    """Drop the passages ``grader`` grades not relevant to ``query``.

    Example::

        stage = grade_filter(load_grader("models/grader"), question, reranked_passages)
        contexts = stage.kept  # [] and stage.all_dropped → answer closed-book
    """
    results = grader.grade(query, list(passages))
    return GradeFilterResult([p for p, r in zip(passages, results) if r.relevant], results)
