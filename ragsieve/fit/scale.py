"""Ray Data scale-out for the heavy phases of ``ragsieve fit`` (``--ray ADDRESS|local``).

* **Conf(Q+C)** over question × candidate (the prefs phase): one row per question, scored
  by :class:`ConfidenceShiftScorer`, an actor that loads the LLM and the probe once.
* **Correctness generations** (the label and evaluate phases): one row per prompt,
  answered by :class:`RequestAnswerer`, an actor that loads the LLM once.
* **Sentence shifts** (the sentences phase): one row per question, measured by
  :class:`SentenceShiftMeasurer` with :func:`~ragsieve.fit.sentence_shifts.measure_sentences`.

Each actor computes exactly what the single-process path computes for its rows (the same
:meth:`~ragsieve.probe.model.ConfidenceProbe.score_batch` call per question, the same
:func:`~ragsieve.probe.labels.answer_requests` per batch), so the scores do not depend on
where they ran; rows carry their key and results are matched back by it, never by order.
Resuming stays the caller's: only the rows not yet written are sent.

Needs the optional extra ``ragsieve[ray]``. Example (a local Ray instance on this machine)::

    from ragsieve.fit.scale import ray_confidence_shifts
    rows = [{"question_id": "q1", "question": "who wrote hamlet?", "passages": [passage_dict, ...]}]
    scores = ray_confidence_shifts("local", rows, llm="embedded:smollm2-135m-instruct", probe="sieve/probe")
    scores["q1"]   # [Conf(Q), Conf(Q+C_1), ...]
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Sequence

import numpy as np

from ragsieve.cluster import cluster_cpus, init_ray, set_actor_threads
from ragsieve.data.records import Passage
from ragsieve.probe.labels import LabeledGeneration, LabelRequest


class ConfidenceShiftScorer:
    """Ray actor: [Conf(Q), Conf(Q+C_1), ...] for each row (question + its candidate passages)."""

    def __init__(self, llm: str, probe: str, batch_size: int = 8, threads: int = 1):
        from ragsieve.models import load_local_llm
        from ragsieve.probe.model import ConfidenceProbe

        set_actor_threads(threads)
        self.probe = ConfidenceProbe.load(probe, load_local_llm(llm), batch_size=batch_size)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        scores = []
        for question, passages in zip(batch["question"], batch["passages"]):
            cands = [Passage(**p) for p in json.loads(passages)]
            scores.append(json.dumps(self.probe.score_batch([question] * (len(cands) + 1), [None, *cands]).tolist()))
        return {"question_id": batch["question_id"], "scores": np.array(scores, dtype=object)}


class RequestAnswerer:
    """Ray actor: greedy answers + correctness labels for a batch of label requests."""

    def __init__(self, llm: str, max_prompt_tokens: int = 1024, max_new_tokens: int = 16, batch_size: int = 8,
                 threads: int = 1):
        from ragsieve.models import load_local_llm
        from ragsieve.prompts.builder import PromptBuilder

        set_actor_threads(threads)
        self.llm = load_local_llm(llm)
        self.builder = PromptBuilder(self.llm, None, max_prompt_tokens)
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from ragsieve.probe.labels import answer_requests

        requests = [request_from_json(r) for r in batch["request"]]
        gens = answer_requests(self.llm, self.builder, requests, max_new_tokens=self.max_new_tokens,
                               batch_size=self.batch_size)
        return {"generation": np.array([json.dumps(asdict(g)) for g in gens], dtype=object)}


class SentenceShiftMeasurer:
    """Ray actor: a question's ``sentence_shifts.jsonl`` row (its top passages' sentences alone and left out), in
    the answer's likelihood or (``probe`` given) the probe's Conf, as the single-process phase measures it."""

    def __init__(self, llm: str, signal: str, probe: str | None = None, max_prompt_tokens: int = 1024,
                 batch_size: int = 8, leave_one_out: bool = False, threads: int = 1):
        from ragsieve.models import load_local_llm
        from ragsieve.prompts.builder import PromptBuilder

        set_actor_threads(threads)
        self.llm = load_local_llm(llm)
        self.builder = PromptBuilder(self.llm, None, max_prompt_tokens)
        self.signal, self.batch_size, self.leave_one_out = signal, batch_size, leave_one_out
        self.probe = None
        if probe is not None:
            from ragsieve.probe.model import ConfidenceProbe

            self.probe = ConfidenceProbe.load(probe, self.llm, batch_size=batch_size)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from ragsieve.data.records import Question
        from ragsieve.fit.sentence_shifts import answer_likelihood, measure_sentences, probe_confidence

        rows = []
        for item in batch["item"]:
            d = json.loads(item)
            q = Question(d["question_id"], d["question"], tuple(d["answers"]))

            def confidence(contexts, q=q):
                if self.probe is not None:
                    return probe_confidence(self.probe, q, contexts)
                return answer_likelihood(self.llm, self.builder, q, contexts, self.batch_size)

            top = [Passage(**p) for p in d["passages"]]
            rows.append(json.dumps(measure_sentences(q, top, self.signal, confidence, self.leave_one_out)))
        return {"row": np.array(rows, dtype=object)}


def ray_sentence_shifts(
    address: str, rows: Sequence[dict], *, llm: str, signal: str, probe: str | None = None,
    max_prompt_tokens: int = 1024, batch_size: int = 8, leave_one_out: bool = False,
) -> dict[str, dict]:
    """question_id → its sentence-shift row, for rows ``{question_id, question, answers, passages}``."""
    if not rows:
        return {}
    items = [{"item": json.dumps({"question_id": r["question_id"], "question": r["question"],
                                  "answers": list(r["answers"]),
                                  "passages": [p if isinstance(p, dict) else asdict(p) for p in r["passages"]]})}
             for r in rows]
    out = _on_actors(address, items, SentenceShiftMeasurer,
                     {"llm": llm, "signal": signal, "probe": probe, "max_prompt_tokens": max_prompt_tokens,
                      "batch_size": batch_size, "leave_one_out": leave_one_out})
    measured = [json.loads(row["row"]) for row in out]
    return {row["question_id"]: row for row in measured}


def _on_actors(address: str, items: list[dict], actor: type, kwargs: dict, batch_size: int | None = None
               ) -> list[dict]:
    """``items`` mapped by ``actor`` (built once per worker with ``kwargs``) on Ray Data, one single-CPU actor per
    cluster CPU; ``batch_size`` None hands each actor one block of the items."""
    init_ray(address)
    import ray

    workers = min(cluster_cpus(), len(items))
    # one block per actor and no repartition: on a small cluster the actors hold every CPU, so a
    # shuffle task would wait for a CPU forever
    return ray.data.from_items(items, override_num_blocks=workers).map_batches(
        actor, fn_constructor_kwargs=kwargs, batch_size=batch_size or max(1, len(items) // workers),
        concurrency=workers, num_cpus=1,
    ).take_all()


def request_to_json(request: LabelRequest) -> str:
    return json.dumps({**asdict(request), "answers": list(request.answers)})


def request_from_json(text: str) -> LabelRequest:
    row = json.loads(text)
    row["answers"] = tuple(row["answers"])
    row["contexts"] = [Passage(**p) for p in row["contexts"]]
    return LabelRequest(**row)


def ray_confidence_shifts(
    address: str, rows: Sequence[dict], *, llm: str, probe: str, batch_size: int = 8
) -> dict[str, list[float]]:
    """question_id → [Conf(Q), Conf(Q+C_1), ...] for rows ``{question_id, question, passages: [dict]}``."""
    if not rows:
        return {}
    items = [{"question_id": r["question_id"], "question": r["question"],
              "passages": json.dumps([p if isinstance(p, dict) else asdict(p) for p in r["passages"]])} for r in rows]
    out = _on_actors(address, items, ConfidenceShiftScorer, {"llm": llm, "probe": str(probe), "batch_size": batch_size})
    return {row["question_id"]: json.loads(row["scores"]) for row in out}


def ray_answer_requests(
    address: str, requests: Sequence[LabelRequest], *, llm: str, max_prompt_tokens: int = 1024,
    max_new_tokens: int = 16, batch_size: int = 8,
) -> list[LabeledGeneration]:
    """Every request answered and labelled on Ray, returned in the order given."""
    if not requests:
        return []
    out = _on_actors(address, [{"request": request_to_json(r)} for r in requests], RequestAnswerer,
                     {"llm": llm, "max_prompt_tokens": max_prompt_tokens, "max_new_tokens": max_new_tokens,
                      "batch_size": batch_size}, batch_size=batch_size)
    by_key: dict[str, LabeledGeneration] = {}
    for row in out:
        g = LabeledGeneration(**json.loads(row["generation"]))
        by_key[g.key] = g
    return [by_key[r.key] for r in requests]
