"""Phases 1–2 of ``ragsieve fit``: the questions split, and each one's retrieved candidates.

* **split** reads the loaded questions and writes ``<work>/split.json`` (question ids by split); the state
  gets ``splits``. The split is a function of the ids and the seed, so a resumed fit splits the same way.
* **retrieve** reads the index; the state gets ``candidates`` (question id → its top ``candidates``
  passages). Nothing is written: retrieval is fast and deterministic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragsieve.atomic import write_json_atomic
from ragsieve.data.records import Question
from ragsieve.errors import RagsieveError
from ragsieve.fit.config import FitConfig

if TYPE_CHECKING:
    from ragsieve.fit.state import FitState


def fit_splits(config: FitConfig, questions: list[Question]) -> dict[str, list[Question]]:
    """The train / dev / test questions; a split with fewer than 2 is an error naming the file."""
    from ragsieve.data.qa_files import split_questions

    splits = split_questions(questions, config.split, config.seed)
    small = [name for name, qs in splits.items() if len(qs) < 2]
    if small:
        raise RagsieveError(
            f"{config.questions}: too few questions for the {'/'.join(small)} split "
            f"({len(questions)} in all); give more questions"
        )
    return splits


def check_fit_questions(config: FitConfig) -> None:
    """The QA file and its split sizes, checked before the index and the LLM load or any phase runs."""
    from ragsieve.data.qa_files import read_qa_file

    fit_splits(config, read_qa_file(config.questions)[: config.max_questions or None])


def split_train_dev_test(state: "FitState") -> None:
    splits = state.splits = fit_splits(state.config, state.questions)
    write_json_atomic(state.work / "split.json", {k: [q.id for q in v] for k, v in splits.items()})
    state.progress("split", 1, 1)


def retrieve_candidates(state: "FitState") -> None:
    hits = state.retriever.search_batch([q.text for q in state.questions], k=state.config.candidates)
    state.candidates = {q.id: [h.passage for h in row] for q, row in zip(state.questions, hits)}
    state.progress("retrieve", 1, 1)
