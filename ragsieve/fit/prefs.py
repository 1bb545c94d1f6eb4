"""Phase 6 of ``ragsieve fit``: preference groups for the reranker, from the train questions only.

With a probe: Inc = Conf(Q+C) − Conf(Q) for each candidate, appended per question to ``<work>/shifts.jsonl``
(and ``<records>/shifts.jsonl``, ids and scores only) as it is measured, so a killed fit measures only the
questions not yet written; shifts recorded on another machine for the same candidates are taken as they are.
The top ``n_pos`` / bottom ``n_neg`` candidates by Inc make a group. An endpoint (no probe): a passage is a
positive when the LLM answers right with it alone and wrong closed-book, a negative when it answers wrong with
it (those answers go through the answer cache). The state gets ``prefs`` (``{"train": [PreferenceRecord]}``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ragsieve.data.records import Question

if TYPE_CHECKING:
    from ragsieve.fit.state import FitState


def measure_preferences(state: "FitState") -> None:
    from ragsieve.prefs.preferences import select_preferences

    if state.probe is None:
        _answer_preferences(state)
        return
    questions = state.splits["train"]  # only train groups are trained on: dev is read by relevance, not shifts
    shifts = _confidence_shifts(state, questions)
    records = []
    for q in questions:
        rec = select_preferences(q.text, state.candidates[q.id], shifts[q.id]["inc"],
                                 n_pos=state.config.align.n_pos, n_neg=state.config.align.n_neg, question_id=q.id,
                                 signed=state.config.align.selection == "signed")
        if rec is not None:
            records.append(rec)
    state.prefs = {"train": records}


def _confidence_shifts(state: "FitState", questions: list[Question]) -> dict[str, dict]:
    """Question id → its shifts row (``conf_q``, ``inc`` by candidate, ``candidate_ids``): read from the work
    folder and the records, the rest measured and appended to both."""
    from ragsieve.data.jsonl import append_jsonl, read_jsonl

    path = state.work / "shifts.jsonl"
    done = {row["question_id"]: row for row in read_jsonl(path, skip_bad=True)} if path.exists() else {}
    record = state.records / "shifts.jsonl" if state.records else None
    if record is not None and record.is_file():  # shifts measured on another machine (ids and scores only)
        for row in read_jsonl(record, skip_bad=True):
            cands = state.candidates.get(row["question_id"])
            # a record of other candidates (another index or candidate count) is measured again
            if row["question_id"] not in done and cands and row["candidate_ids"] == [p.id for p in cands]:
                append_jsonl(path, row)
                done[row["question_id"]] = row
    todo = [q for q in questions if q.id not in done]
    state.progress("prefs", len(questions) - len(todo), len(questions))
    for q, scores in _confidence_scores(state, todo):
        scores = np.asarray(scores, dtype=np.float64)
        row = {"question_id": q.id, "conf_q": float(scores[0]), "inc": (scores[1:] - scores[0]).tolist(),
               "candidate_ids": [p.id for p in state.candidates[q.id]]}
        append_jsonl(path, row)  # a kill loses at most the questions not yet written
        if record is not None:
            append_jsonl(record, row)
        done[q.id] = row
        state.progress("prefs", sum(q.id in done for q in questions), len(questions))
    return done


def _confidence_scores(state: "FitState", questions: list[Question]):
    """(question, [Conf(Q), Conf(Q+C_1), ...]) for each: on Ray when configured, else one question at a time."""
    if state.config.ray:
        from ragsieve.fit.scale import ray_confidence_shifts

        scored = ray_confidence_shifts(
            state.config.ray, [{"question_id": q.id, "question": q.text, "passages": state.candidates[q.id]}
                               for q in questions],
            llm=state.config.llm, probe=str(state.out / "probe"), batch_size=state.config.batch_size)
        yield from ((q, scored[q.id]) for q in questions)
        return
    for q in questions:
        cands = state.candidates[q.id]
        yield q, state.probe.score_batch([q.text] * (len(cands) + 1), [None, *cands])


def _answer_preferences(state: "FitState") -> None:
    """Preference groups from answers (no probe): each candidate alone in the prompt; positives are
    the passages the LLM answers right with, for a question it answers wrong closed-book; negatives
    the ones it answers wrong with (retrieval order first: the hardest)."""
    from ragsieve.eval.qa import contains_answer
    from ragsieve.prefs.preferences import PreferenceRecord
    from ragsieve.prompts import first_line

    limit = state.config.align.answer_candidates or state.config.candidates
    questions = state.splits["train"]  # dev's relevance check reads gold passages, not these answers
    texts = [state.builder.with_context(q.text, [p]).text for q in questions for p in state.candidates[q.id][:limit]]
    answers = iter(state.answers.answers(texts, lambda done, total: state.progress("prefs", done, total)))
    n_pos, n_neg = state.config.align.n_pos, state.config.align.n_neg
    state.prefs = {"train": []}
    for q in questions:
        cands = state.candidates[q.id][:limit]
        right = [contains_answer(first_line(next(answers)[0]), q.answers) for _ in cands]
        if state.closed[q.id]:
            continue  # right without any passage: no passage is shown to help
        pos = [p for p, ok in zip(cands, right) if ok][:n_pos]
        neg = [p for p, ok in zip(cands, right) if not ok][:n_neg]
        if pos and neg:
            state.prefs["train"].append(PreferenceRecord(
                q.text, [p.full_text for p in pos], [p.full_text for p in neg], [1.0] * len(pos),
                [0.0] * len(neg), q.id, [p.id for p in pos], [p.id for p in neg]))
