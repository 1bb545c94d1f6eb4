"""The grader contract: ``grade(query, passages) -> [GradeResult(relevant, score)]``.

A grader is a ranker plus a threshold (as AnswerDotAI rerankers' ``LLMRelevanceFilter``
is a ranker): :class:`Grader` subclasses :class:`~ragsieve.rerank.base.BaseRanker`, so
it ranks like any reranker, and ``score >= threshold`` makes it a relevance filter.
A grader decides, per (query, retrieved passage), relevant or not. Every grader shares
the input policy here (empty passages, counting), the saved layout (a JSON config that
names the base model, plus a safetensors file for whatever was trained) and the
refusal to load on top of a different base model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np
from pydantic import ValidationError

from ragsieve.artifacts import GRADER_REBUILD, read_json_artifact
from ragsieve.config import StrictConfig, format_validation_error
from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.grade.prompt import INSTRUCTION, SYSTEM
from ragsieve.rerank.base import BaseRanker

CONFIG_FILE = "grader_config.json"
WEIGHTS_FILE = "grader.safetensors"
# Bump when the saved layout changes, so an old folder is refused instead of misread.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class GradeResult:
    """One verdict: ``relevant`` is ``score >= threshold`` (an empty passage is never relevant)."""

    relevant: bool
    score: float

    @classmethod
    def at(cls, threshold: float, text: str, score: float) -> "GradeResult":
        """The verdict for ``score`` against ``threshold``; an empty ``text`` is never relevant."""
        return cls(bool(text.strip()) and bool(score >= threshold), float(score))


@dataclass
class GradeStats:
    """Running counts of what a grader had to do to its inputs."""

    pairs: int = 0
    empty_passages: int = 0
    truncated_passages: int = 0
    truncated_queries: int = 0


class GraderConfig(StrictConfig):
    """What a saved grader is: its kind, the base model it was built on, its prompt and budget.

    ``base`` is the base LLM spec for LLM graders, the encoder spec for the cosine
    baseline and the model folder for the cross-encoder baseline.
    """

    kind: str
    base: str
    threshold: float = 0.5
    max_length: int = 512
    max_passage_tokens: int = 384
    max_query_tokens: int = 96
    system: str = SYSTEM
    instruction: str = INSTRUCTION
    lora_r: int | None = None
    lora_alpha: int | None = None
    lora_target_modules: str | list[str] = "all-linear"
    hidden_size: int | None = None  # the base's width when trained: a changed base is refused
    format_version: int = FORMAT_VERSION
    trained: dict[str, Any] = {}  # training summary: steps, loss, data, sampling, ...


def read_grader_config(path: str | Path) -> GraderConfig:
    """The config of a saved grader folder; one-line errors for anything that is not one."""
    path = Path(path)
    file = path / CONFIG_FILE
    if path.is_file():
        raise RagsieveError(f"{path}: is a file; give the grader folder (the one holding {CONFIG_FILE})")
    if not file.is_file():
        raise RagsieveError(f"{path}: not a saved grader (no {CONFIG_FILE}); {GRADER_REBUILD}")
    data = read_json_artifact(file, GRADER_REBUILD)
    try:
        config = GraderConfig.model_validate(data)
    except ValidationError as exc:
        raise RagsieveError(f"{format_validation_error(exc, str(file))}; {GRADER_REBUILD}") from None
    if config.format_version != FORMAT_VERSION:
        raise RagsieveError(
            f"{file}: grader format {config.format_version}, this ragsieve reads {FORMAT_VERSION}; {GRADER_REBUILD}"
        )
    return config


def passage_texts(passages: Sequence[Passage | str]) -> list[str]:
    """What a grader reads of each passage: ``title: text`` for records, the string itself otherwise."""
    out = []
    for i, p in enumerate(passages):
        if isinstance(p, Passage):
            out.append(p.full_text if p.text.strip() else "")
        elif isinstance(p, str):
            out.append(p)
        else:
            raise RagsieveError(f"passage {i} is a {type(p).__name__}, expected Passage or str")
    return out


class Grader(BaseRanker, ABC):
    """Relevance grader: one verdict and score per (query, passage).

    Policy for bad input, shared by every grader: an empty or whitespace-only passage is
    graded not relevant with score 0 without calling the model (counted in
    ``stats.empty_passages``); passages over the token budget are truncated (counted in
    ``stats.truncated_passages``); an empty query is an error.

    Example::

        grader = load_grader("models/grader")   # ragsieve.registry.load_grader
        for r in grader.grade("who wrote hamlet?", ["Hamlet is by Shakespeare.", "Paris is in France."]):
            print(r.relevant, round(r.score, 3))
    """

    kind: ClassVar[str] = ""
    #: the base a fresh grader of this kind starts from when none is given
    default_base: ClassVar[str] = ""

    def __init__(self, config: GraderConfig):
        self.config = config
        self.stats = GradeStats()

    # -- public API ------------------------------------------------------------
    @property
    def name(self) -> str:  # the ranker name tables and judges show
        return f"grader:{self.kind}"

    @property
    def threshold(self) -> float:
        return self.config.threshold

    def grade(self, query: str, passages: Sequence[Passage | str]) -> list[GradeResult]:
        """Verdicts for ``passages`` (records or plain strings) in input order."""
        texts = passage_texts(passages)
        scores = self.score_pairs([query] * len(texts), texts)
        return [GradeResult.at(self.threshold, t, s) for t, s in zip(texts, scores)]

    def score_pairs(self, queries: Sequence[str], passages: Sequence[Passage | str]) -> np.ndarray:
        """Scores for aligned (query, passage) pairs, batched; empty passages score 0."""
        passages = passage_texts(passages)
        if len(queries) != len(passages):
            raise RagsieveError(f"got {len(queries)} queries but {len(passages)} passages")
        for q in queries:
            if not isinstance(q, str) or not q.strip():
                raise RagsieveError("empty query")
        scores = np.zeros(len(passages), dtype=np.float64)
        keep = [i for i, p in enumerate(passages) if p.strip()]
        self.stats.pairs += len(passages)
        self.stats.empty_passages += len(passages) - len(keep)
        if keep:
            scores[keep] = self._score([queries[i] for i in keep], [passages[i] for i in keep])
        return scores

    def predict(self, queries: Sequence[str], passages: Sequence[Passage | str]) -> tuple[np.ndarray, np.ndarray]:
        """``(labels, scores)`` for aligned pairs: what evaluation needs."""
        passages = passage_texts(passages)
        scores = self.score_pairs(queries, passages)
        nonempty = np.array([bool(p.strip()) for p in passages], dtype=bool)
        return ((scores >= self.threshold) & nonempty).astype(np.int64), scores

    # -- persistence -------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write ``grader_config.json`` (+ ``grader.safetensors`` when something was trained)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        weights = path / WEIGHTS_FILE
        weights.unlink(missing_ok=True)  # an untrained grader must not pick up stale weights
        self._save_weights(weights)
        (path / CONFIG_FILE).write_text(self.config.model_dump_json(indent=2) + "\n", encoding="utf-8")
        return path

    # -- subclass hooks -----------------------------------------------------------
    @classmethod
    def normalize_base(cls, base: str) -> str:
        """The canonical spelling of a base, so equal bases compare equal."""
        return base

    @classmethod
    @abstractmethod
    def create(cls, config: GraderConfig) -> "Grader":
        """A grader of this kind built on ``config.base`` (untrained)."""

    @abstractmethod
    def _score(self, queries: list[str], passages: list[str]) -> np.ndarray:
        """Scores for non-empty, aligned pairs."""

    def _save_weights(self, file: Path) -> None:
        """Write what was trained to ``file`` (safetensors); nothing by default."""

    def _load_weights(self, folder: Path) -> None:
        """Load what :meth:`save` wrote; the default loads nothing."""

    def fit(self, queries: Sequence[str], passages: Sequence[str], labels: Sequence[int], config: Any, **kwargs) -> Any:
        raise RagsieveError(f"the '{self.kind}' grader has nothing to train")
