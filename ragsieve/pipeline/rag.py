"""The RAG pipeline: (gate) → retrieve → (rerank → grade) → generate.

Batched answering over prompts built by :class:`~ragsieve.prompts.builder.PromptBuilder`.
Later stages (gate, reranker, grader) plug in as optional components; the post-retrieval ones
act through :class:`~ragsieve.pipeline.stages.SieveStages`, the one sieve.
:meth:`RAGPipeline.from_config` is the one place a pipeline is assembled, from specs or around
components that are already loaded (the server's, a :class:`Sieve`'s).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.pipeline.config import PipelineConfig
from ragsieve.pipeline.stages import CandidateTrace, FilterResult, SieveStages
from ragsieve.prompts import QAPrompts
from ragsieve.prompts import first_line
from ragsieve.prompts.builder import PromptBuilder, in_prompt_order

if TYPE_CHECKING:
    from ragsieve.gate.cbdr import CBDRGate
    from ragsieve.grade.base import Grader
    from ragsieve.models.llm import Generator
    from ragsieve.prune import SentencePruner
    from ragsieve.rerank.base import BaseRanker
    from ragsieve.retrieve.base import Retriever

log = logging.getLogger(__name__)


@dataclass
class RAGAnswer:
    """An answer and what every stage decided on the way (``trace``: what ``ask --explain`` prints)."""

    question: str
    answer: str
    contexts: list[Passage] = field(default_factory=list)
    retrieved: bool = False
    truncated_contexts: int = 0
    seconds: float = 0.0
    confidence: float | None = None  # Conf(Q) when a CBDR gate decided
    beta: float | None = None  # the gate's β
    graded_out: int = 0  # passages the grader dropped as irrelevant
    all_graded_out: bool = False  # every retrieved passage dropped → answered closed-book
    candidates: list[CandidateTrace] = field(default_factory=list)
    prompt_tokens: int | None = None

    def to_dict(self) -> dict:
        """JSON-ready: the answer, the stage decisions and the passages used."""
        from dataclasses import asdict

        out = asdict(self)
        out["contexts"] = [{"id": p.id, "title": p.title, "text": p.text} for p in self.contexts]
        return out


class RAGPipeline:
    """Answer questions closed-book or with retrieved contexts.

    Example::

        pipe = RAGPipeline(load_llm(), load_index("index/nq"), top_k=3)
        pipe.answer("who wrote hamlet").answer

    With a ``reranker``, ``candidates`` passages are retrieved and reranked, and the
    best ``top_k`` of them reach the LLM. A ``grader`` then drops the passages it
    grades irrelevant; if it drops all of them the question is answered closed-book
    and :attr:`RAGAnswer.all_graded_out` says so.
    """

    @staticmethod
    def load_stages(config: PipelineConfig) -> SieveStages:
        """The post-retrieval stages the config names (reranker, grader, top_k), without the LLM."""
        from ragsieve.registry import load_grader, load_reranker

        config = config.expanded()  # a sieve's stages become this config's
        reranker = load_reranker(config.reranker) if config.reranker else None
        pruner = load_reranker(config.pruner) if config.pruner and config.prunes else None
        return SieveStages.from_config(
            config, reranker, load_grader(config.grader) if config.grader else None, pruner_scorer=pruner,
        )

    @classmethod
    def from_config(
        cls, config: PipelineConfig, *, llm: "Generator | None" = None, retriever: "Retriever | None" = None,
        stages: SieveStages | None = None, gate: "CBDRGate | None" = None,
    ) -> "RAGPipeline":
        """Build every stage the config names; ``llm``, ``retriever``, ``stages`` (reranker, grader) and
        ``gate`` reuse already loaded ones instead of loading the config's.

        Example::

            pipe = RAGPipeline.from_config(PipelineConfig(index="index/nq", reranker="embedded:base"))
        """
        from ragsieve.models import load_llm
        from ragsieve.registry import load_probe

        if retriever is None and config.index is not None:
            from ragsieve.retrieve import load_index

            retriever = load_index(config.index)
        config = config.expanded()  # a sieve's stages become this config's
        llm = llm if llm is not None else load_llm(config.llm, timeout=config.timeout, retries=config.retries)
        if gate is None and config.cbdr_beta is not None:
            from ragsieve.gate import CBDRGate

            gate = CBDRGate(load_probe(config.probe, llm), config.cbdr_beta)
        stages = stages if stages is not None else cls.load_stages(config)
        return cls(
            llm, retriever, top_k=config.top_k, max_prompt_tokens=config.max_prompt_tokens,
            max_new_tokens=config.max_new_tokens, batch_size=config.batch_size, gate=gate,
            reranker=stages.reranker, candidates=config.candidates, grader=stages.grader,
            passage_order=config.passage_order, pruner=stages.pruner,
        )

    def __init__(
        self,
        llm: "Generator",
        retriever: "Retriever | None" = None,
        *,
        top_k: int = 3,
        max_prompt_tokens: int = 1024,
        max_new_tokens: int = 16,
        batch_size: int = 8,
        prompts: QAPrompts | None = None,
        gate: "CBDRGate | None" = None,
        reranker: "BaseRanker | None" = None,
        candidates: int = 20,
        grader: "Grader | None" = None,
        passage_order: str = "best_first",
        pruner: "SentencePruner | None" = None,
    ):
        if top_k < 0:
            raise RagsieveError(f"top_k must be >= 0 (0: closed book), got {top_k}")
        if reranker is not None and candidates < top_k:
            raise RagsieveError(f"candidates ({candidates}) must be >= top_k ({top_k}) when reranking")
        self.llm = llm
        self.retriever = retriever
        self.top_k = top_k
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.gate = gate
        self.reranker = reranker
        self.candidates = candidates
        self.grader = grader
        self.passage_order = passage_order
        self.pruner = pruner
        self.builder = PromptBuilder(llm, prompts, max_prompt_tokens)

    def with_retriever(self, retriever: "Retriever | None") -> "RAGPipeline":
        """The same stages (shared, not reloaded) around another retriever."""
        from copy import copy

        other = copy(self)
        other.retriever = retriever
        return other

    @property
    def stages(self) -> SieveStages:
        """The post-retrieval stages (rerank → top_k → grade), the one sieve every caller applies."""
        return SieveStages(self.reranker, self.grader, top_k=self.top_k, pruner=self.pruner)

    def retrieve(self, questions: Sequence[str]) -> list[list[Passage]]:
        """The top_k passages per question after retrieval and reranking (before grading)."""
        return [result.selected for result in self._retrieve_selected(questions)]

    def _retrieve_selected(self, questions: Sequence[str]) -> list[FilterResult]:
        if self.retriever is None:
            raise RagsieveError("no retriever configured: build an index (ragsieve index) or answer closed-book")
        depth = self.candidates if self.reranker is not None else self.top_k
        hits = self.retriever.search_batch(list(questions), k=depth)
        stages = self.stages
        return [stages.select(q, [h.passage for h in row]) for q, row in zip(questions, hits)]

    def answer_many(self, questions: Sequence[str], *, retrieve: bool = True) -> list[RAGAnswer]:
        questions = [q.strip() if isinstance(q, str) else "" for q in questions]
        for i, q in enumerate(questions):
            if not q:
                raise RagsieveError(f"empty question at position {i}")
        start = time.perf_counter()
        # The gate answers confident questions closed-book; only the rest retrieve.
        decisions = self.gate.decide_many(questions) if (self.gate and retrieve) else None
        needs = [d.retrieve for d in decisions] if decisions else [retrieve] * len(questions)
        needs = [flag and self.top_k > 0 for flag in needs]  # top_k 0: a sieve that answers closed-book
        contexts: list[list[Passage]] = [[] for _ in questions]
        traces: list[list[CandidateTrace]] = [[] for _ in questions]
        graded_out = [0] * len(questions)
        to_retrieve = [i for i, flag in enumerate(needs) if flag]
        if to_retrieve:
            stages = self.stages
            for i, selected in zip(to_retrieve, self._retrieve_selected([questions[i] for i in to_retrieve])):
                result = stages.finish(selected)
                contexts[i], traces[i], graded_out[i] = result.kept, result.trace(), result.graded_out
        # the kept passages stay best first everywhere else; only the prompt may put the best last
        built = [self.builder.with_context(q, in_prompt_order(c, self.passage_order))
                 for q, c in zip(questions, contexts)]
        texts = self.llm.generate(
            [b.text for b in built],
            system=self.builder.prompts.system,
            max_new_tokens=self.max_new_tokens,
            batch_size=self.batch_size,
        )
        per_question = (time.perf_counter() - start) / max(len(questions), 1)
        truncated = sum(b.truncated_contexts for b in built)
        if truncated:
            log.warning("%d context passage(s) truncated to fit max_prompt_tokens", truncated)
        return [
            RAGAnswer(
                question=q, answer=first_line(t), contexts=c, retrieved=flag,
                truncated_contexts=b.truncated_contexts, seconds=per_question,
                confidence=decisions[i].confidence if decisions else None,
                beta=self.gate.beta if decisions else None,
                graded_out=graded_out[i], all_graded_out=bool(flag and graded_out[i] and not c),
                candidates=traces[i], prompt_tokens=self.builder.prompt_tokens(b.text),
            )
            for i, (q, t, c, b, flag) in enumerate(zip(questions, texts, contexts, built, needs))
        ]

    def answer(self, question: str, *, retrieve: bool = True) -> RAGAnswer:
        return self.answer_many([question], retrieve=retrieve)[0]
