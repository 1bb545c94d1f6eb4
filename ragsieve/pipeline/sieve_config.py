"""``sieve.json``: what a fitted sieve is made of (read by the pipeline and by :class:`~ragsieve.pipeline.sieve.Sieve`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field

from ragsieve.config import StrictConfig, build_config
from ragsieve.errors import RagsieveError
from ragsieve.specs import DEFAULT_LLM

SIEVE_FILE = "sieve.json"
FORMAT_VERSION = 3  # 2: top_k may be 0 (closed book) and passage_order (issue #39); 3: sentence pruning (#61)


class SieveConfig(StrictConfig):
    """What ``sieve.json`` holds. Component values are folders relative to the sieve, or specs."""

    format_version: int = FORMAT_VERSION
    llm: str = DEFAULT_LLM
    probe: Optional[str] = None  # None: no gate (always retrieve)
    layer: Optional[int] = None  # the probe's layer (1-based), recorded for the reader
    beta: Optional[float] = Field(None, ge=0.0, le=1.0)
    policy: str = ""  # how β was chosen: "parity", "budget=0.6", "fixed"
    reranker: Optional[str] = None  # None: the retriever's order
    grader: Optional[str] = None
    top_k: int = Field(3, ge=0)  # 0: closed book (the LLM answered best without passages)
    passage_order: Literal["best_first", "best_last"] = "best_first"  # where the best passage goes in the prompt
    # sentence pruning of every kept passage: keep the sentences whose score (raw, on the pruning scorer's scale)
    # is >= prune_threshold, always the best one; None: kept passages stay whole
    prune_threshold: Optional[float] = Field(None, allow_inf_nan=False)
    pruner: Optional[str] = None  # the sentence scorer (folder or spec); None: the sieve's reranker
    prune_max_sentences: Optional[int] = Field(None, ge=1)  # at most this many sentences per kept passage
    # "across": the threshold and caps apply to every sentence of the kept passages together (the best
    # prune_max_sentences in all, within prune_token_cap tokens), a passage left without one dropped (issue #69)
    prune_scope: Literal["passage", "across"] = "passage"
    prune_token_cap: Optional[int] = Field(None, ge=1)  # scope across: the kept sentences' tokens in all, at most
    candidates: int = Field(20, ge=1)
    max_prompt_tokens: int = Field(1024, ge=64)
    max_new_tokens: int = Field(16, ge=1)
    metrics: dict[str, Any] = {}
    versions: dict[str, str] = {}
    created: str = ""


def sieve_folder(spec: str | Path) -> Path:
    """A sieve's folder: ``embedded:<name>`` (shipped or cached), a bare shipped name, or a path as given
    (resolved by :func:`ragsieve.registry.sieve_folder`)."""
    from ragsieve.registry import sieve_folder as resolve

    return resolve(spec)


def read_sieve_config(path: str | Path) -> SieveConfig:
    """``sieve.json`` of a sieve folder (or ``embedded:<name>``); one-line errors for anything that is not one."""
    from ragsieve.artifacts import read_json_artifact

    folder = sieve_folder(path)
    file = folder / SIEVE_FILE
    if not file.is_file():
        why = "folder not found" if not folder.exists() else f"no {SIEVE_FILE}"
        raise RagsieveError(f"{folder}: not a sieve ({why}); build one with `ragsieve fit`")
    hint = "rebuild it with `ragsieve fit`"
    config = build_config(SieveConfig, read_json_artifact(file, hint), source=str(file))
    if config.format_version > FORMAT_VERSION:
        raise RagsieveError(f"{file}: sieve format {config.format_version}, this ragsieve reads <= {FORMAT_VERSION}")
    return config


def resolve_component(folder: str | Path, value: str) -> str:
    """A component named in ``sieve.json``: a folder inside the sieve wins over a spec of the same name."""
    candidate = Path(folder) / value
    return str(candidate) if candidate.exists() else value
