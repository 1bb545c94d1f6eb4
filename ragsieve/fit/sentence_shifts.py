"""One question's sentence shifts (the ``sentences`` phase of ``ragsieve fit``, :mod:`ragsieve.fit.sentences`):
what each sentence of its top passages does to the LLM alone and left out. Pure functions of the LLM and its
prompt builder, so the phase in one process and its Ray actors (:mod:`ragsieve.fit.scale`) measure the same rows.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ragsieve.data.records import Passage, Question


def measure_sentences(q: Question, top: Sequence[Passage], signal: str,
                      confidence: Callable[[list[Sequence[Passage] | None]], list[float]],
                      leave_one_out: bool) -> dict[str, Any]:
    """One question's row of ``sentence_shifts.jsonl``: Conf(Q), Conf(Q + top), each sentence of ``top`` alone
    and (``leave_one_out``, where the top context raises Conf) left out, ``confidence`` measuring a list of
    contexts (None: closed book) in ``signal``. The same function runs in one process and in a Ray actor."""
    from ragsieve.prune import PrunedPassage, split_sentences

    spans = [split_sentences(p.text) for p in top]
    sentences = [Passage(f"{p.id}#{a}-{b}", p.text[a:b], p.title) for p, ss in zip(top, spans) for a, b in ss]
    conf_q, conf_top, *alone = confidence([None, list(top), *[[s] for s in sentences]])
    without: list[float | None] = [None] * len(sentences)
    if leave_one_out and conf_top > conf_q and len(sentences) > 1:
        contexts = []
        for i, (p, ss) in enumerate(zip(top, spans)):
            for k in range(len(ss)):
                cut = PrunedPassage(p, tuple(ss), (0.0,) * len(ss), tuple(j != k for j in range(len(ss))))
                rest = [x for j, x in enumerate(top) if j != i]
                contexts.append(rest[:i] + [cut.as_passage()] + rest[i:] if cut.n_kept else rest)
        without = list(confidence(contexts))
    return {"question_id": q.id, "signal": signal, "passage_ids": [p.id for p in top],
            "spans": [[list(s) for s in ss] for ss in spans],
            "conf_q": float(conf_q), "conf_top": float(conf_top), "alone": [float(x) for x in alone],
            "without": [None if w is None else float(w) for w in without]}


def answer_likelihood(llm, builder, q: Question, contexts: Sequence[Sequence[Passage] | None],
                      batch_size: int = 8) -> list[float]:
    """For each context (None: closed book), the likelihood of the likeliest of ``q``'s first three gold answers
    after the prompt: the geometric mean of its token probabilities (RECOMP's signal)."""
    prompts = [builder.chat_prompt(q.text, c or ()) for c in contexts]
    golds = [a for a in q.answers if a.strip()][:3]
    logp = llm.continuation_logprob([p for p in prompts for _ in golds], [a for _ in prompts for a in golds],
                                    batch_size=batch_size)
    return [float(x) for x in np.exp(logp.reshape(len(prompts), len(golds)).max(axis=1))]


def probe_confidence(probe, q: Question, contexts: Sequence[Sequence[Passage] | None]) -> list[float]:
    """For each context (None: closed book), the probe's Conf(Q + context)."""
    return [float(x) for x in probe.score_batch([q.text] * len(contexts), list(contexts))]
