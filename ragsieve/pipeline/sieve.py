"""A sieve: every stage of the pipeline fitted to one LLM, in one folder.

``ragsieve fit`` writes it; ``Sieve.load`` reads it. The folder holds ``sieve.json`` (the
LLM spec, the probe layer and β with the policy that chose it, the reranker and grader,
every held-out metric with its 95 % interval, library versions) and safetensors weights
only (``probe/``, ``reranker/``, ``grader/``). A component may instead name a spec
(``embedded:base``, ``embedded:smollm2-nq``), so a sieve can reuse shipped parts.

Example::

    from ragsieve import Sieve
    sieve = Sieve.load("sieves/mine")
    sieve.should_retrieve("who wrote hamlet?")            # GateDecision(confidence, retrieve)
    kept = sieve.filter("who wrote hamlet?", passages)    # reranked, graded, what to keep
    sieve.answer("who wrote hamlet?", retriever=load_index("index/mine")).answer
    wider = Sieve(sieve.config.model_copy(update={"top_k": 2}), sieve.folder)   # runs as changed, no new folder
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.pipeline.sieve_config import SIEVE_FILE, SieveConfig, read_sieve_config
from ragsieve.pipeline.stages import FilterResult, SieveStages

if TYPE_CHECKING:
    from ragsieve.gate.cbdr import CBDRGate, GateDecision
    from ragsieve.grade.base import Grader
    from ragsieve.models.llm import Generator
    from ragsieve.pipeline.config import PipelineConfig
    from ragsieve.pipeline.rag import RAGAnswer, RAGPipeline
    from ragsieve.rerank.base import BaseRanker, RankedResults
    from ragsieve.retrieve.base import Retriever

class Sieve:
    """A fitted gate → rerank → grade for one LLM; components load on first use."""

    def __init__(self, config: SieveConfig, folder: str | Path | None = None, *, llm: "Generator | None" = None):
        self.config = config
        self.folder = Path(folder) if folder is not None else None
        self._llm = llm

    @classmethod
    def load(cls, path: str | Path, *, llm: "Generator | None" = None) -> "Sieve":
        """The sieve in folder ``path`` (or ``embedded:default``, the one shipped for the embedded SmolLM2);
        ``llm`` reuses an already loaded LLM (it must be the sieve's)."""
        from ragsieve.pipeline.sieve_config import sieve_folder

        folder = sieve_folder(path)
        return cls(read_sieve_config(folder), folder, llm=llm)

    def save(self, path: str | Path) -> Path:
        """Write ``sieve.json`` into ``path`` (the weights are written by whoever fitted them)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / SIEVE_FILE).write_text(self.config.model_dump_json(indent=2) + "\n", encoding="utf-8")
        return path

    # -- components: built once, by the one pipeline builder -----------------------------------
    def _config(self) -> "PipelineConfig":
        from ragsieve.pipeline.config import PipelineConfig

        if self.folder is None:
            raise RagsieveError("this sieve has no folder yet: save it first")
        # this object's config, not the folder's sieve.json: a sieve loaded and then changed runs as changed
        return PipelineConfig().with_sieve(self.config, self.folder)

    @cached_property
    def stages(self) -> SieveStages:
        """The post-retrieval stages (rerank → top_k → grade) that :meth:`filter`, the server and the
        adapters apply; they load without the LLM."""
        from ragsieve.pipeline.rag import RAGPipeline

        return RAGPipeline.load_stages(self._config())

    @cached_property
    def _pipe(self) -> "RAGPipeline":
        from ragsieve.pipeline.rag import RAGPipeline

        return RAGPipeline.from_config(self._config(), llm=self._llm, stages=self.stages)

    @property
    def llm(self) -> "Generator":
        return self._pipe.llm

    @property
    def gate(self) -> "CBDRGate | None":
        return self._pipe.gate

    @property
    def reranker(self) -> "BaseRanker":
        from ragsieve.rerank.base import RetrievalOrder

        return self.stages.reranker or RetrievalOrder()

    @property
    def grader(self) -> "Grader | None":
        return self.stages.grader

    # -- the stages ------------------------------------------------------------------------------
    def should_retrieve(self, question: str) -> "GateDecision":
        """Conf(Q) against β: retrieve only when the LLM is not confident enough (always, without a gate)."""
        from ragsieve.gate.cbdr import GateDecision

        if not question.strip():
            raise RagsieveError("empty question")
        if self.gate is None:
            return GateDecision(float("nan"), True)
        return self.gate.decide_many([question])[0]

    def rerank(self, question: str, passages: Sequence[Passage | str]) -> "RankedResults":
        """Passages ordered by what this LLM can use (the sieve's reranker; a long one by its best chunk)."""
        return self.stages.rank(question, passages)

    def filter(self, question: str, passages: Sequence[Passage | str]) -> FilterResult:
        """Rerank, keep the top_k, grade them: what to put in the prompt, with scores and verdicts.

        Scores and the threshold are raw (as ``sieve.json`` stores it; the logit for ``embedded:base``);
        ``/v1/filter`` answers the same kept passages with their [0, 1] values,
        ``self.reranker.unit_scores(...)`` and ``self.grader.unit_scores(...)`` of these.
        """
        return self.stages.apply(question, passages)

    def pipeline(self, retriever: "Retriever | None" = None) -> "RAGPipeline":
        """The full pipeline with this sieve's stages around ``retriever`` (components are shared)."""
        return self._pipe.with_retriever(retriever)

    def answer(self, question: str, retriever: "Retriever | None" = None) -> "RAGAnswer":
        """Gate → retrieve → rerank → grade → generate for one question; ``trace`` on the answer says why."""
        return self.pipeline(retriever).answer(question, retrieve=retriever is not None)
