"""LLM judge: teacher labels from any generator (local HF model or OpenAI-compatible endpoint).

The judge is asked the grading question (:func:`ragsieve.grade.prompt.user_message`),
its answer parsed to yes/no (:func:`~ragsieve.grade.prompt.parse_verdict`); answers
that say neither are counted and excluded. Every answer is appended (and fsynced) to a
jsonl store as soon as it arrives, so a crash or an endpoint going down loses nothing
and a rerun asks only what is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

from ragsieve.errors import RagsieveError
from ragsieve.grade.prompt import INSTRUCTION, parse_verdict, user_message
from ragsieve.models.llm import Generator


class JudgeablePair(Protocol):
    """Anything with a stable ``id``, a ``query`` and a ``passage`` text (e.g. a GradingPair)."""

    id: str
    query: str
    passage: str


@dataclass
class JudgeReport:
    """Labels of one judging pass; ``labels`` holds parsed answers only."""

    judge: str
    labels: dict[str, int] = field(default_factory=dict)
    unparseable_ids: list[str] = field(default_factory=list)
    judged: int = 0  # asked in this pass
    reused: int = 0  # read back from the store

    @property
    def unparseable(self) -> int:
        return len(self.unparseable_ids)

    def summary(self) -> dict:
        positives = sum(self.labels.values())
        return {
            "judge": self.judge, "labelled": len(self.labels), "positives": positives,
            "unparseable": self.unparseable, "judged_now": self.judged, "reused_from_store": self.reused,
        }


class LLMJudge:
    """Labels (query, passage) pairs with a generator and keeps every answer in ``store``.

    Endpoints are asked one pair per request (each answer is stored before the next
    request); a local model is asked in batches of ``batch_size``. When the endpoint
    stays down after the client's retries with backoff, one error line says how many
    labels are saved and that a rerun resumes.

    Example::

        from ragsieve.models import load_llm
        judge = LLMJudge(load_llm("openai:http://localhost:8000/v1#llama3"), "results/grader/judge.jsonl")
        report = judge.label(pairs)          # pairs: anything with .id, .query, .passage
        report.labels["nq:123|wiki:abc"], report.unparseable
    """

    def __init__(
        self,
        generator: Generator,
        store: str | Path,
        *,
        batch_size: int | None = None,
        max_new_tokens: int = 8,
        instruction: str = INSTRUCTION,
        system: str | None = None,
    ):
        self.generator = generator
        self.store = Path(store)
        local = hasattr(generator, "tokenizer")
        self.batch_size = batch_size or (8 if local else 1)
        self.max_new_tokens = max_new_tokens
        self.instruction = instruction
        self.system = system  # None: the generator's own default

    @property
    def spec(self) -> str:
        return self.generator.spec

    def stored(self) -> dict[str, dict]:
        """This judge's stored answers by pair id (other judges' rows and a torn last line are ignored)."""
        from ragsieve.data import read_jsonl

        if not self.store.exists():
            return {}
        rows = read_jsonl(self.store, skip_bad=True)
        return {row["id"]: row for row in rows if row.get("judge") == self.spec and "id" in row}

    def label(self, pairs: Sequence[JudgeablePair], progress: Callable[[int], None] | None = None) -> JudgeReport:
        from ragsieve.data import append_jsonl

        done = self.stored()
        todo = [p for p in pairs if p.id not in done]
        report = JudgeReport(self.spec, reused=len(pairs) - len(todo))
        if progress:
            progress(report.reused)
        for lo in range(0, len(todo), self.batch_size):
            batch = todo[lo : lo + self.batch_size]
            messages = [user_message(p.query, p.passage, self.instruction) for p in batch]
            try:
                answers = self.generator.generate(
                    messages, system=self.system, max_new_tokens=self.max_new_tokens, batch_size=len(batch)
                )
            except RagsieveError as exc:
                raise RagsieveError(
                    f"LLM judge stopped: {exc}; {len(done)} label(s) are saved in {self.store}, rerun to resume"
                ) from None
            for pair, answer in zip(batch, answers, strict=True):
                row = {"id": pair.id, "judge": self.spec, "answer": answer, "label": parse_verdict(answer)}
                append_jsonl(self.store, row)
                done[pair.id] = row
                report.judged += 1
            if progress:
                progress(len(batch))
        for pair in pairs:
            label = done[pair.id]["label"]
            if label is None:
                report.unparseable_ids.append(pair.id)
            else:
                report.labels[pair.id] = int(label)
        return report
