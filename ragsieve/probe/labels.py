"""Correctness labels: answer greedily, mark correct by normalised answer containment.

Every generation is appended to a jsonl as soon as its batch finishes, so labels can
be audited and an interrupted run resumes where it stopped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from ragsieve.data.records import Passage

if TYPE_CHECKING:
    from ragsieve.models.llm import LocalLLM
    from ragsieve.probe.cache import StateCache
    from ragsieve.prompts.builder import PromptBuilder


@dataclass
class LabelRequest:
    """One (question, context) prompt to answer; ``variant`` names the context kind."""

    question_id: str
    question: str
    answers: tuple[str, ...]
    variant: str  # "closed" | "gold" | "retrieved" | "top1" | ...
    contexts: list[Passage] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.question_id}|{self.variant}|{','.join(p.id for p in self.contexts)}"


@dataclass
class LabeledGeneration:
    question_id: str
    variant: str
    context_ids: list[str]
    generation: str
    correct: int
    em: float
    f1: float
    truncated_contexts: int = 0

    @property
    def key(self) -> str:
        return f"{self.question_id}|{self.variant}|{','.join(self.context_ids)}"


def read_generations(path: str | Path) -> dict[str, LabeledGeneration]:
    """Previously labelled generations by key; a half-written last line is ignored."""
    from ragsieve.data import read_jsonl

    path = Path(path)
    if not path.exists():
        return {}
    out = {}
    for row in read_jsonl(path, skip_bad=True):
        g = LabeledGeneration(**row)
        out[g.key] = g
    return out


def _capture_layers(state_layer: int | None, state_layers: Sequence[int] | None) -> list[int]:
    return sorted({*(state_layers or ()), *([state_layer] if state_layer else [])})


def generate_caching_states(
    llm: "LocalLLM",
    builder: "PromptBuilder",
    messages: Sequence[str],
    layers: Sequence[int],
    state_cache: "StateCache",
    *,
    max_new_tokens: int = 16,
    batch_size: int = 16,
) -> list[str]:
    """Greedy answers to the user ``messages``; the pre-token states of ``layers`` are read from the
    generation's own prefill and cached under the key the probe's extractor uses for the same prompt."""
    from ragsieve.probe.hidden import prompt_key

    texts, by_layer = llm.generate_with_layer_states(
        messages, layers, system=builder.prompts.system, max_new_tokens=max_new_tokens, batch_size=batch_size
    )
    chats = [builder.to_chat(m) for m in messages]
    state_cache.put_many({
        prompt_key(llm.spec, layer, chat): by_layer[layer][i] for layer in layers for i, chat in enumerate(chats)
    })
    return texts


def answer_requests(
    llm: "LocalLLM",
    builder: "PromptBuilder",
    batch: Sequence[LabelRequest],
    *,
    max_new_tokens: int = 16,
    batch_size: int = 16,
    state_layer: int | None = None,
    state_cache: "StateCache | None" = None,
    state_layers: Sequence[int] | None = None,
) -> list[LabeledGeneration]:
    """Answer one batch of requests greedily and label each answer (no file, no resume: see below).

    With a ``state_cache``, the pre-token states of ``state_layer`` and every layer of
    ``state_layers`` are read from the generation's own prefill and cached before the
    answers are returned, so a stored generation always has its states (unless the cache
    file was moved away; :func:`~ragsieve.probe.hidden.fill_layer_cache` recomputes them).
    """
    from ragsieve.eval.qa import contains_answer, exact_match, token_f1
    from ragsieve.prompts import first_line

    built = [builder.with_context(r.question, r.contexts) for r in batch]
    messages = [b.text for b in built]
    system = builder.prompts.system
    layers = _capture_layers(state_layer, state_layers)
    if layers and state_cache is not None:
        texts = generate_caching_states(llm, builder, messages, layers, state_cache, max_new_tokens=max_new_tokens,
                                        batch_size=batch_size)
    else:
        texts = llm.generate(messages, system=system, max_new_tokens=max_new_tokens, batch_size=batch_size)
    out = []
    for r, b, text in zip(batch, built, texts):
        answer = first_line(text)
        out.append(LabeledGeneration(
            question_id=r.question_id,
            variant=r.variant,
            context_ids=[p.id for p in r.contexts],
            generation=answer,
            correct=int(contains_answer(answer, r.answers)),
            em=float(exact_match(answer, r.answers)),
            f1=float(token_f1(answer, r.answers)),
            truncated_contexts=b.truncated_contexts,
        ))
    return out


def label_generations(
    llm: "LocalLLM",
    builder: "PromptBuilder",
    requests: Sequence[LabelRequest],
    out_path: str | Path,
    *,
    max_new_tokens: int = 16,
    batch_size: int = 16,
    progress: Callable[[int], None] | None = None,
    state_layer: int | None = None,
    state_cache: "StateCache | None" = None,
    state_layers: Sequence[int] | None = None,
) -> list[LabeledGeneration]:
    """Answer every request (skipping ones already in ``out_path``) and label it.

    With ``state_layer`` (or several ``state_layers``) and ``state_cache``, each layer's
    pre-token state is captured during generation and cached under the same key the
    probe's extractor uses, so the probe's training states (and a whole layer sweep's)
    cost no extra forward pass. A killed run keeps every finished batch: states are
    committed to the cache before the batch's generations are appended, so a rerun
    answers (and captures) only the requests missing from ``out_path``.
    """
    from ragsieve.data import append_jsonl

    done = read_generations(out_path)
    # identical requests (same question, variant and contexts) are answered once
    todo = list({r.key: r for r in requests if r.key not in done}.values())
    # Similar lengths per batch: a closed-book prompt padded to a passage prompt's length
    # would cost as much as the passage prompt.
    todo.sort(key=lambda r: len(r.question) + sum(len(p.title) + len(p.text) for p in r.contexts))
    if progress:
        progress(len(requests) - len(todo))
    for lo in range(0, len(todo), batch_size):
        batch = todo[lo : lo + batch_size]
        for g in answer_requests(llm, builder, batch, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                 state_layer=state_layer, state_cache=state_cache, state_layers=state_layers):
            append_jsonl(out_path, asdict(g))
            done[g.key] = g
        if progress:
            progress(len(batch))
    return [done[r.key] for r in requests]


def reuse_generations(
    requests: Sequence[LabelRequest], out_path: str | Path, sources: Sequence[str | Path]
) -> int:
    """Copy into ``out_path`` the stored answers of ``sources`` to the same prompts.

    Returns how many (distinct) requests the sources answer, copied now or by an earlier call.

    A generation depends only on the question and its contexts (same LLM, prompt template,
    token budget and ``max_new_tokens``: the caller checks those), not on the variant's
    name, so another study's ``gold`` answer serves this one's ``top1`` request when the
    top hit is the gold passage. Copies are appended under this study's variant name, so
    :func:`label_generations` then answers only what no source holds. Idempotent.

    Example::

        reuse_generations(requests, "results/cbdr_nq/generations.jsonl",
                          ["results/probe_nq/generations.jsonl"])
    """
    from ragsieve.data import append_jsonl

    done = read_generations(out_path)
    stored: dict[tuple[str, tuple[str, ...]], LabeledGeneration] = {}
    for source in sources:
        for g in read_generations(source).values():
            stored.setdefault((g.question_id, tuple(g.context_ids)), g)
    served = 0
    for r in {r.key: r for r in requests}.values():
        g = stored.get((r.question_id, tuple(p.id for p in r.contexts)))
        if g is None:
            continue
        served += 1
        if r.key not in done:
            append_jsonl(out_path, {**asdict(g), "variant": r.variant})
    return served
