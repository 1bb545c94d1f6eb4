"""Your evaluation questions: a QA ``.jsonl`` file, the one thing ``ragsieve fit`` needs you to bring.

Each line is ``{"question": str, "answers": [str, ...], "id"?: str, "gold_passage_ids"?: [str, ...]}``
(``answer`` as a single string is accepted too). Ids default to ``q<line>``; duplicates,
rows without a question or without any answer are one-line errors naming file and line.

Example::

    questions = read_qa_file("my_questions.jsonl")
    splits = split_questions(questions, {"train": 0.6, "dev": 0.2, "test": 0.2})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ragsieve.data.jsonl import read_jsonl
from ragsieve.data.records import Question
from ragsieve.data.splits import split_by_id
from ragsieve.errors import DataError


def read_qa_file(path: str | Path) -> list[Question]:
    """Questions with their gold answers, in file order."""
    questions: list[Question] = []
    seen: dict[str, int] = {}
    for lineno, row in read_jsonl(path).numbered():
        where = f"{path}:{lineno}"
        if not isinstance(row, dict):
            raise DataError(f"{where}: each line must be a JSON object")
        text = row.get("question")
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: needs a non-empty 'question' string")
        answers = row.get("answers", row.get("answer"))
        answers = [answers] if isinstance(answers, str) else answers
        if not isinstance(answers, list) or not [a for a in answers if isinstance(a, str) and a.strip()]:
            raise DataError(f"{where}: needs 'answers', a list of at least one non-empty string")
        qid = str(row.get("id") or f"q{lineno}")
        if qid in seen:
            raise DataError(f"{where}: duplicate id '{qid}' (first on line {seen[qid]})")
        seen[qid] = lineno
        gold = row.get("gold_passage_ids") or []
        questions.append(Question(qid, text.strip(), tuple(str(a) for a in answers if str(a).strip()),
                                  tuple(str(g) for g in gold)))
    if not questions:
        raise DataError(f"{path}: no questions")
    return questions


def split_questions(
    questions: Sequence[Question], fractions: Mapping[str, float], seed: int = 0
) -> dict[str, list[Question]]:
    """Questions split by a hash of their id (stable when questions are added or reordered).

    Salted: a QA file cut from a dataset's train side by the same hash (as the fit benchmark
    cuts NQ) would otherwise give an empty test split.
    """
    ids = split_by_id([q.id for q in questions], fractions, seed, salt="qa-file:")
    by_id = {q.id: q for q in questions}
    return {name: [by_id[i] for i in members] for name, members in ids.items()}
