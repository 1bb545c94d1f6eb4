"""The ``sentences`` phase of ``ragsieve fit`` (issue #71): which sentences this LLM needs, from its own answers,
and a keep head trained on them.

A keep head shipped with ragsieve learned from dataset annotations (supporting facts, answer sentences) that a
user's corpus does not have. Here the labels come from the user's LLM on the user's train questions, as RECOMP
and LooComp label a compressor's sentences by what they do to the LM: for each train question, every sentence of
the top ``sentences.passages`` candidates of the start reranker (or of the retriever) is measured alone and, with
``sentences.leave_one_out``, left out:

* **alone**: Conf(Q + sentence) − Conf(Q), what the sentence adds by itself (sufficiency);
* **left out**: Conf(Q + top passages) − Conf(Q + top passages without it), what the context loses without it
  (necessity; measured only where the whole context raises Conf(Q), since elsewhere there is nothing to lose),

and labelled by how far ``max(alone, left out)`` rises above the question's median sentence, over the best
one's margin (at least ``sentences.min_shift``), clipped to [0, 1]: a graded target, 1 for the sentence that helps
this LLM most. "Conf" is what :func:`measured_by` names: for a local LLM, by default the likelihood of a gold
answer after the prompt (the geometric mean of its token probabilities, RECOMP's signal), or the probe's Conf
(``sentences.signal: conf``); for an endpoint-only fit the LLM's answer itself (1 when it contains a gold answer,
0 otherwise), so one formula serves all three. On SmolLM2 the probe's Conf shifts hardly told the sentence holding
the answer from the others (results/fit/README.md); the answer's likelihood did.
Each question's measurements are appended to ``<work>/sentence_shifts.jsonl``
(and ``<records>/sentence_shifts.jsonl``: ids, spans and numbers, no text) as they are made, and every answer goes
through the answer cache: a killed fit measures only what is missing. With ``--ray`` (a local LLM) the questions
are measured on Ray Data actors, a round of a few questions per actor at a time
(:func:`~ragsieve.fit.scale.ray_sentence_shifts`, the same
:func:`~ragsieve.fit.sentence_shifts.measure_sentences`).

The shipped keep head is then trained on these labels (:class:`~ragsieve.prune.training.KeepHeadTrainer`, its
loss taking them as soft targets; checkpointed per epoch under ``<work>/keep_head``) and written to
``<out>/prune_head.safetensors``, unless it forgot what the annotations taught (:func:`forgetting_guard`: on NQ's
held-out gold passages it must keep the answer sentence at best 1 non-inferiorly to the shipped head, at
``sentences.guard_margin``; not measured without the bundled data); the state gets ``sentence_labels`` (question
id → its :class:`~ragsieve.prune.training.KeepExample` s), ``head_guard`` and ``fitted_head`` (the file, or None).
The verdict is kept in ``<work>/head_check.json`` and ``<records>/head_check.json``, keyed by the labels and
settings: a rerun takes it without training again, and a rejection recorded elsewhere stands on a new machine.

Off unless ``sentences.enabled``: the phase then leaves both empty.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ragsieve.data.records import Passage, Question
from ragsieve.fit.sentence_shifts import answer_likelihood, measure_sentences, probe_confidence

if TYPE_CHECKING:
    from ragsieve.fit.state import FitState
    from ragsieve.prune.training import KeepExample

log = logging.getLogger(__name__)

SHIFTS_FILE = "sentence_shifts.jsonl"
HEAD_FILE = "prune_head.safetensors"
HEAD_CHECK_FILE = "head_check.json"  # the trained head's guard verdict, keyed by its labels and settings


def label_sentences(state: "FitState") -> None:
    """Measure (or read) every train question's sentence shifts, label them, and train the fitted head."""
    state.sentence_labels, state.fitted_head, state.head_guard, state.fitted_head_report = {}, None, {}, {}
    settings = state.config.sentences
    if not settings.enabled:
        return
    rows = _sentence_shifts(state, state.splits["train"])
    by_id = {q.id: q for q in state.splits["train"]}
    state.sentence_labels = {qid: examples_from_row(by_id[qid], state.candidates[qid], row, settings.min_shift)
                             for qid, row in rows.items() if qid in by_id}
    examples = [e for group in state.sentence_labels.values() for e in group]
    from ragsieve.prune.training import KEEP_LABEL

    log.info("fit: sentence labels for %d train questions, %d sentences, %d to keep", len(state.sentence_labels),
             sum(len(e.labels) for e in examples), sum(y >= KEEP_LABEL for e in examples for y in e.labels))
    if not any(y > 0 for e in examples for y in e.labels):
        log.warning("fit: no sentence raised the LLM's confidence on the train questions: no fitted keep head")
        return
    key = _head_key(state)
    decided = _decided_head(state, key)
    if decided is not None:  # trained and guarded before on these labels and settings: the decision stands
        state.head_guard, state.fitted_head_report = decided["guard"], decided["report"]
        state.fitted_head = state.out / HEAD_FILE if decided["kept"] else None
        return
    head = _train_head(state, examples)
    state.head_guard = forgetting_guard(head, settings.guard_questions, settings.guard_margin,
                                        state.config.data_dir)
    kept = state.head_guard.get("non_inferior") is not False
    if not kept:  # it forgot what the annotations taught: not in the grid
        head.replace(state.work / f"rejected-{HEAD_FILE}")
        log.warning("fit: the fitted keep head is left out: %s", state.head_guard["verdict"])
    _record_head_decision(state, key, kept)
    state.fitted_head = head if kept else None


def _head_key(state: "FitState") -> str:
    """The labels and settings a fitted head is trained and guarded on (a change of either trains it again)."""
    import hashlib
    import json

    settings = state.config.sentences
    labels = sorted([qid, [[e.passage.id, [round(y, 6) for y in e.labels]] for e in group]]
                    for qid, group in state.sentence_labels.items())
    return hashlib.sha1(json.dumps([labels, settings.model_dump(), state.config.data_dir], sort_keys=True,
                                   default=str).encode()).hexdigest()


def _decided_head(state: "FitState", key: str) -> dict[str, Any] | None:
    """The recorded decision for ``key``: ``<work>/head_check.json`` (with the kept head in ``<out>``), or a
    rejection in ``<records>/head_check.json`` made on another machine (a kept head needs its weights: trained
    again there)."""
    import json

    check = state.work / HEAD_CHECK_FILE
    if check.is_file():
        decided = json.loads(check.read_text())
        if decided.get("key") == key and (not decided["kept"] or (state.out / HEAD_FILE).is_file()):
            return decided
    record = state.records / HEAD_CHECK_FILE if state.records else None
    if record is not None and record.is_file():
        decided = json.loads(record.read_text())
        if decided.get("key") == key and not decided["kept"]:
            (state.out / HEAD_FILE).unlink(missing_ok=True)
            return decided
    return None


def _record_head_decision(state: "FitState", key: str, kept: bool) -> None:
    from ragsieve.atomic import write_json_atomic

    decided = {"key": key, "kept": kept, "guard": state.head_guard, "report": state.fitted_head_report}
    write_json_atomic(state.work / HEAD_CHECK_FILE, decided)
    if state.records is not None:
        write_json_atomic(state.records / HEAD_CHECK_FILE, decided)


def examples_from_row(q: Question, candidates: Sequence[Passage], row: dict[str, Any], min_shift: float = 0.05
                      ) -> list["KeepExample"]:
    """One :class:`~ragsieve.prune.training.KeepExample` per measured passage of ``row`` (a line of
    ``sentence_shifts.jsonl``), each sentence labelled by how far its shift ``max(alone, left out)`` rises above
    the question's median sentence, over the best one's margin (at least ``min_shift``), clipped to [0, 1]. A weak
    LLM's Conf moves by hundredths and by about as much for any text (SmolLM2 on NQ: mean shift 0.05, one sentence
    in 1,644 at 0.5), so raw shifts would teach nothing; a question whose best sentence stands out by less than
    ``min_shift`` keeps low labels. Right / wrong answers (an endpoint) are labelled as they are."""
    from ragsieve.prune.training import KeepExample

    by_id = {p.id: p for p in candidates}
    alone = np.asarray(row["alone"], dtype=float) - row["conf_q"]
    left_out = np.array([np.nan if w is None else row["conf_top"] - w for w in row["without"]], dtype=float)
    shifts = np.fmax(alone, left_out)
    measured = [row["conf_q"], row["conf_top"], *row["alone"], *(w for w in row["without"] if w is not None)]
    if all(v in (0.0, 1.0) for v in measured):  # right / wrong answers: already on the unit scale
        labels = np.clip(shifts, 0.0, 1.0)
    else:  # above the question's typical sentence (any text moves a weak LLM's Conf a little), over the best margin
        typical = max(float(np.median(shifts)), 0.0) if len(shifts) > 1 else 0.0
        scale = max(float(np.max(shifts, initial=0.0)) - typical, min_shift)
        labels = np.clip((shifts - typical) / scale, 0.0, 1.0)
    out, start = [], 0
    for pid, spans in zip(row["passage_ids"], row["spans"]):
        n = len(spans)
        if pid in by_id and n:
            out.append(KeepExample(q.id, q.text, by_id[pid], tuple(tuple(s) for s in spans),
                                   tuple(float(y) for y in labels[start:start + n])))
        start += n
    return out


def measured_by(state: "FitState") -> str:
    """What a sentence's shift is measured in: ``answer likelihood``, ``probe Conf`` or ``answers`` (endpoint)."""
    if state.endpoint_only:
        return "answers"
    return "answer likelihood" if state.config.sentences.signal == "answer" else "probe Conf"


def _row_signal(state: "FitState", row: dict[str, Any]) -> str:
    # rows written before the signal was recorded were measured by the probe's Conf, or answers for an endpoint
    return row.get("signal") or ("answers" if state.endpoint_only else "probe Conf")


def _sentence_shifts(state: "FitState", questions: Sequence[Question]) -> dict[str, dict[str, Any]]:
    """Question id → its row: read from the work folder and the records, the rest measured and appended to both.
    Rows of another signal are not reused."""
    from ragsieve.data.jsonl import append_jsonl, read_jsonl

    signal = measured_by(state)
    path = state.work / SHIFTS_FILE
    done = {r["question_id"]: r for r in read_jsonl(path, skip_bad=True)
            if _row_signal(state, r) == signal} if path.exists() else {}
    record = state.records / SHIFTS_FILE if state.records else None
    by_id = {q.id: q for q in questions}
    if record is not None and record.is_file():  # measured on another machine: taken for the same passages
        for row in read_jsonl(record, skip_bad=True):
            q = by_id.get(row["question_id"])
            if (q is not None and q.id not in done and _row_signal(state, row) == signal
                    and row["passage_ids"] == [p.id for p in _top(state, q)]):
                append_jsonl(path, row)
                done[q.id] = row
    todo = [q for q in questions if q.id not in done]
    state.progress("sentences", len(questions) - len(todo), len(questions))
    for measured in _measured(state, todo):
        for row in measured:  # a kill loses at most the round in flight (answers stay in the answer cache)
            append_jsonl(path, row)
            if record is not None:
                append_jsonl(record, row)
            done[row["question_id"]] = row
        state.progress("sentences", sum(q.id in done for q in questions), len(questions))
    return done


def _measured(state: "FitState", todo: Sequence[Question]):
    """Rows of ``todo`` a round at a time: on Ray (``--ray``, a local LLM) rounds of a few questions per worker,
    else one question per round in this process."""
    if not (state.config.ray and not state.endpoint_only):
        for q in todo:
            yield [_measure_question(state, q)]
        return
    from ragsieve.cluster import cluster_cpus, init_ray
    from ragsieve.fit.scale import ray_sentence_shifts

    init_ray(state.config.ray)
    size = 4 * max(1, cluster_cpus())  # a round per a few questions each: a kill loses little, actors load once
    signal = measured_by(state)
    for start in range(0, len(todo), size):
        chunk = todo[start:start + size]
        rows = ray_sentence_shifts(
            state.config.ray, [{"question_id": q.id, "question": q.text, "answers": q.answers,
                                "passages": _top(state, q)} for q in chunk],
            llm=state.config.llm, signal=signal, probe=str(state.out / "probe") if signal == "probe Conf" else None,
            max_prompt_tokens=state.config.max_prompt_tokens, batch_size=state.config.batch_size,
            leave_one_out=state.config.sentences.leave_one_out)
        yield [rows[q.id] for q in chunk]


def _top(state: "FitState", q: Question) -> list[Passage]:
    """The question's top candidates in the start reranker's order (the passages a sieve would prune), or the
    retriever's (``sentences.order``)."""
    settings = state.config.sentences
    if settings.order == "retriever":
        return state.candidates[q.id][: settings.passages]
    ranked = state.rankings.ranked(state.config.align.init, q)
    return [state.candidates[q.id][i] for i, _ in ranked[: settings.passages]]


def _measure_question(state: "FitState", q: Question) -> dict[str, Any]:
    return measure_sentences(q, _top(state, q), measured_by(state), lambda c: _confidence(state, q, c),
                             state.config.sentences.leave_one_out)


def _confidence(state: "FitState", q: Question, contexts: Sequence[Sequence[Passage] | None]) -> list[float]:
    """Conf(Q + context) for each context (None: closed book), as :func:`measured_by` names it: the answer's
    likelihood (:func:`answer_likelihood`), the probe's Conf, or 1 / 0 by whether an endpoint's answer contains a
    gold answer."""
    signal = measured_by(state)
    if signal == "answer likelihood":
        return answer_likelihood(state.llm, state.builder, q, contexts, state.config.batch_size)
    if signal == "probe Conf":
        return probe_confidence(state.probe, q, contexts)
    from ragsieve.eval.qa import contains_answer
    from ragsieve.prompts import first_line

    texts = [state.builder.closed_book(q.text).text if c is None else state.builder.with_context(q.text, c).text
             for c in contexts]
    return [float(contains_answer(first_line(a), q.answers)) for a, _ in state.answers.answers(texts)]


def forgetting_guard(head_file: Path, max_questions: int, margin: float, data_dir: str | None = None
                     ) -> dict[str, Any]:
    """Did training on the LLM's labels cost what the annotations taught? On the NQ questions every ragsieve study
    holds out (:func:`~ragsieve.data.held_out_questions`: the shipped head never trained on them; a fit's own
    questions are its user's), the share whose gold passage the fitted head cuts to a best sentence holding the
    answer, against the shipped head's on the same questions: non-inferior at ``margin`` or not
    (:func:`~ragsieve.eval.stats.non_inferior`). Without the bundled NQ data (a user's machine) nothing is
    measured and the head stays (``non_inferior`` None)."""
    from ragsieve.data import held_out_questions, load_dataset
    from ragsieve.errors import RagsieveError
    from ragsieve.eval.qa import contains_answer
    from ragsieve.eval.stats import non_inferior
    from ragsieve.prune import SentencePruner, split_sentences
    from ragsieve.prune.head import SentenceKeepHead

    try:
        ds = load_dataset("nq-oracle", data_dir=data_dir)
    except RagsieveError as why:
        return {"non_inferior": None, "verdict": f"not measured: {str(why).splitlines()[0]}"}
    pool = {p.id: p for p in ds.passages}
    asked = []  # (question, its gold passage): a passage of 2+ sentences, one of them holding an answer
    for q in held_out_questions(ds.questions, 0.2, 0):
        gold = next((pool[i] for i in q.gold_passage_ids if i in pool), None)
        spans = split_sentences(gold.text) if gold else []
        if len(spans) > 1 and any(contains_answer(gold.text[a:b], q.answers) for a, b in spans):
            asked.append((q, gold))
        if len(asked) == max_questions:
            break
    hits = {}
    for name, head in (("fitted", SentenceKeepHead(head_file)), ("shipped", SentenceKeepHead())):
        best = SentencePruner(head, max_sentences=1)
        hits[name] = [int(contains_answer(best.prune(q.text, [gold])[0].text, q.answers)) for q, gold in asked]
    if not asked:
        return {"non_inferior": None, "verdict": "not measured: no held-out NQ question with a gold passage"}
    result = non_inferior(hits["fitted"], hits["shipped"], margin).to_dict()
    return {**result, "metric": "answer sentence kept at best 1, NQ held-out gold passages",
            "fitted": float(np.mean(hits["fitted"])), "shipped": float(np.mean(hits["shipped"]))}


def _train_head(state: "FitState", examples: Sequence["KeepExample"]) -> Path:
    """The shipped keep head trained further on ``examples``, written to ``<out>/prune_head.safetensors``."""
    from ragsieve.prune.head import SentenceKeepHead
    from ragsieve.prune.training import KeepHeadTrainer

    target = state.out / HEAD_FILE
    head = SentenceKeepHead()
    report = KeepHeadTrainer(head, state.config.sentences.train, state.work / "keep_head").train(examples)
    head.save(target)
    state.fitted_head_report = report
    log.info("fit: keep head trained on the LLM's sentence labels: epoch %d of %d, dev MAP %.3f",
             report["chosen_epoch"], len(report["epochs"]), report["dev_map"])
    return target
