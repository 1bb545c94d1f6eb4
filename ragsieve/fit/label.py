"""Phase 3 of ``ragsieve fit``: the LLM's closed-book and top-k answers to every question, graded.

Reads the questions and their candidates; writes ``<work>/generations.jsonl`` (every generation, appended
as it is made, so a killed fit answers only what is missing) through the answer cache, which the selection
reuses. For a local LLM that is also the generator, the prompts' hidden states at the probe's layers are
captured from the same prefill into the state cache. The state gets ``closed`` and ``plain`` (question id →
whether the closed-book / top-k answer contains a gold answer) and ``power_before`` (what the held-out
questions can show; a warning when less than the selection's margin).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragsieve.fit.state import FitState

log = logging.getLogger(__name__)


def label_answers(state: "FitState") -> None:
    from ragsieve.probe.labels import LabelRequest

    k = state.config.top_k
    requests = []
    for q in state.questions:
        requests.append(LabelRequest(q.id, q.text, q.answers, "closed"))
        requests.append(LabelRequest(q.id, q.text, q.answers, f"top{k}", state.candidates[q.id][:k]))
    if not state.endpoint_only and state.generator is state.llm:
        # the probe's states of these very prompts come from the labels' own prefill
        state.answers.capture_states = (state.state_cache, state.probe_layers())
    try:
        gens = _label(state, requests, state.work / "generations.jsonl", "label")
    finally:
        state.answers.capture_states = None
    state.closed = {g.question_id: g.correct for g in gens if g.variant == "closed"}
    state.plain = {g.question_id: g.correct for g in gens if g.variant == f"top{k}"}
    state.power_before = check_power(state)


def check_power(state: "FitState") -> dict:
    """What the held-out questions (dev + test) can show, said before the long phases: the smallest accuracy
    difference they detect, from how often closed book and top-k answers disagree on every labelled question
    (the only paired answers at hand yet), against the selection's margin; a warning when it is larger, with
    the number of questions that would suffice."""
    from ragsieve.fit.decide import power

    ids = [q.id for q in state.questions]
    share = sum(state.closed[i] != state.plain[i] for i in ids) / max(len(ids), 1)
    n = len(state.splits["dev"]) + len(state.splits["test"])
    margin = state.config.select.margin
    found = power(round(share * n), n, margin)
    if not found["enough"]:
        log.warning("fit: %d held-out questions (dev + test) detect accuracy differences of about %.1f points "
                    "(80 %% power; closed book and top-%d disagree on %.0f %% of questions), more than the %.1f-point "
                    "margin: about %d held-out questions would show it. fit goes on and ships what the evidence "
                    "supports (sieve.json: decided)", n, 100 * found["detectable_difference"], state.config.top_k,
                    100 * share, 100 * margin, found["questions_for_margin"])
    return {**found, "from": f"closed book vs top{state.config.top_k} on {len(ids)} labelled questions"}


def _label(state: "FitState", requests, path: Path, phase: str):
    from ragsieve.probe.labels import label_generations

    done = {"n": 0}

    def advance(n: int) -> None:
        done["n"] += n
        state.progress(phase, done["n"], len(requests))

    if state.config.ray and not state.config.generator and not state.endpoint_only:
        _ray_label(state, requests, path)
    from ragsieve.fit.select import CachedGenerator

    # through the answer cache: the selection reuses these answers (closed book, the retriever's top k)
    return label_generations(
        CachedGenerator(state.answers), state.builder, requests, path, max_new_tokens=state.config.max_new_tokens,
        batch_size=state.config.batch_size, progress=advance,
    )


def _ray_label(state: "FitState", requests, path: Path) -> None:
    """The requests not yet in ``path`` answered on Ray and appended (label_generations then reads them)."""
    from dataclasses import asdict

    from ragsieve.data.jsonl import append_jsonl
    from ragsieve.fit.scale import ray_answer_requests
    from ragsieve.probe.labels import read_generations

    done = read_generations(path)
    todo = list({r.key: r for r in requests if r.key not in done}.values())
    start = time.perf_counter()
    generations = ray_answer_requests(state.config.ray, todo, llm=state.config.llm,
                                      max_prompt_tokens=state.config.max_prompt_tokens,
                                      max_new_tokens=state.config.max_new_tokens, batch_size=state.config.batch_size)
    for g in generations:
        append_jsonl(path, asdict(g))
    if generations:  # into the answer cache too, as the local path does: the selection reuses them
        messages = [state.builder.with_context(r.question, r.contexts).text for r in todo]
        state.answers.put(messages, [g.generation for g in generations],
                          (time.perf_counter() - start) / len(generations))
