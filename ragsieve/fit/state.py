"""What every phase of ``ragsieve fit`` shares: the config, the loaded parts and each phase's results.

:meth:`FitState.load` reads the QA file and loads the index, the LLM (and the generator), the prompt
builder, the answer cache (``<work>/answers.sqlite``, mirrored to ``<records>/answers.jsonl``) and, for a
local LLM, the hidden-state cache (``<work>/states.sqlite``). Each phase module reads what earlier phases
left on the state (``splits``, ``candidates``, ``closed``, ``probe``, ...) and adds its own; the rerankers'
rankings of the candidates are kept once per run in :attr:`FitState.rankings`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from ragsieve.data.records import Passage, Question
from ragsieve.fit.config import FitConfig
from ragsieve.fit.rankings import Rankings
from ragsieve.pipeline.sieve_config import SieveConfig

if TYPE_CHECKING:
    from ragsieve.fit.select import Choice
    from ragsieve.models.llm import LocalLLM
    from ragsieve.probe.model import ConfidenceProbe
    from ragsieve.prompts.builder import PromptBuilder
    from ragsieve.retrieve.base import Retriever

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]  # (phase, done, total)


class FitState:
    """One fit run's config, loaded parts and phase results (the phases fill it in order)."""

    # what the phases leave here, by phase (their modules say what each reads and writes)
    splits: dict[str, list[Question]]  # split
    candidates: dict[str, list[Passage]]  # retrieve: question id → its retrieved passages
    closed: dict[str, bool]  # label: question id → answered right closed-book
    plain: dict[str, bool]  # label: ... with the retriever's top k
    power_before: dict  # label: what the held-out questions can show (ragsieve.fit.decide.power)
    probe: Optional["ConfidenceProbe"]  # probe (None: an endpoint)
    beta: Optional[float]  # gate
    gate_dev: Optional[dict]
    prefs: dict[str, list]  # prefs: {"train": [PreferenceRecord]}
    reranker_spec: str  # rerank: "reranker" (the aligned folder) or what the guard kept instead
    align_check: Optional[dict]
    sentence_labels: dict[str, list]  # sentences: question id → its KeepExamples (LLM-derived labels)
    fitted_head: Optional[Path]  # sentences: the keep head trained on them (None: off, or nothing to learn)
    fitted_head_report: dict
    head_guard: dict  # sentences: the fitted head against the shipped one on NQ held-out gold passages
    f1_thresholds: dict[str, float]  # grade: reranker spec → threshold
    shipped: "Choice"  # select, and what it read and found
    shipped_key: str
    do_no_harm: dict
    confidence: dict[str, float]
    selection: dict
    selection_rows: list[dict]
    selection_marks: dict[str, dict]
    test_rows: dict[str, dict]
    sieve: SieveConfig  # evaluate

    def __init__(self, config: FitConfig, progress: Optional[Progress] = None,
                 on_phase: Optional[Callable[[str], None]] = None):
        from ragsieve.specs import ModelSpec

        # an endpoint only: answers, no hidden states (no probe, no gate, preferences from answers)
        self.endpoint_only = ModelSpec.parse(config.llm).is_endpoint
        self.config = config
        self.progress = progress or (lambda phase, done, total: None)
        self.on_phase = on_phase or (lambda phase: None)  # a phase begins (its progress clock starts)
        self.out = Path(config.out)
        self.work = config.work
        self.timings: dict[str, float] = {}
        self._bearing: dict[str, set[int]] = {}  # question id → answer-bearing candidate indices
        self.rankings = Rankings(self)

    # -- shared parts, loaded once ---------------------------------------------------------------
    def load(self) -> None:
        from ragsieve.data.qa_files import read_qa_file
        from ragsieve.models import load_llm, load_local_llm
        from ragsieve.prompts.builder import PromptBuilder
        from ragsieve.retrieve import load_index

        self.questions = read_qa_file(self.config.questions)
        if self.config.max_questions:
            self.questions = self.questions[: self.config.max_questions]
        self.retriever: "Retriever" = load_index(self.config.index)
        if self.endpoint_only:
            self.llm = self.generator = load_llm(self.config.llm)
            ignored = [name for name in ("generator", "ray") if getattr(self.config, name)]
            if ignored:
                log.warning("fit: %s ignored: the LLM is an endpoint, which answers every prompt",
                            " and ".join(ignored))
        else:
            self.llm: "LocalLLM" = load_local_llm(self.config.llm)
            self.generator = load_llm(self.config.generator) if self.config.generator else self.llm
        self.builder: "PromptBuilder" = PromptBuilder(self.llm, None, self.config.max_prompt_tokens)
        self.work.mkdir(parents=True, exist_ok=True)
        from ragsieve.fit.select import AnswerCache

        # every answer the selection (and answer preferences) asks for, once per unique prompt
        self.records = Path(self.config.records) if self.config.records else None
        if self.records is not None:
            self.records.mkdir(parents=True, exist_ok=True)
        self.answers = AnswerCache(self.work / "answers.sqlite", self.generator, self.builder,
                                   max_new_tokens=self.config.max_new_tokens, batch_size=self.config.batch_size,
                                   records=self.records / "answers.jsonl" if self.records else None)
        if not self.endpoint_only:
            from ragsieve.probe.cache import StateCache

            # the local LLM's hidden states by prompt and layer: labels write them, the probe reads them
            self.state_cache = StateCache(self.work / "states.sqlite")

    # -- read by several phases ------------------------------------------------------------------
    def probe_layers(self) -> list[int]:
        """The candidate layers (1-based) the probe is trained on, ``config.layers`` resolved for this LLM."""
        from ragsieve.probe.hidden import resolve_layer

        return sorted({resolve_layer(x, self.llm.num_layers) for x in self.config.layers})

    def answer_bearing(self, q: Question) -> set[int]:
        """Indices of ``q``'s candidates that contain a gold answer (computed once per question)."""
        from ragsieve.eval.qa import contains_answer

        if q.id not in self._bearing:
            self._bearing[q.id] = {i for i, p in enumerate(self.candidates[q.id])
                                   if contains_answer(p.full_text, q.answers)}
        return self._bearing[q.id]

    def ranker_base(self, spec: str) -> str:
        """A reranker named in ``sieve.json`` as something loadable from here: the sieve's own folder, or
        what the guard kept instead (a spec or an outside folder)."""
        return str(self.out / "reranker") if spec == "reranker" else spec

    def scores_root(self) -> Path:
        """Where scores are kept across runs: the records when given, else the work folder."""
        return (self.records or self.work) / "scores"

