"""Prompt templates, stored as YAML next to this file (prompts are data, not code)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path

from ragsieve.errors import RagsieveError

PROMPT_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class QAPrompts:
    system: str
    closed_book: str
    with_context: str
    context_item: str
    context_separator: str = "\n\n"


def _read_yaml(path: Path) -> dict:
    from ragsieve.config import read_mapping

    return read_mapping(path, "prompt")  # the shared text policy: UTF-8, one-line errors


@lru_cache(maxsize=8)
def load_qa_prompts(path: str | None = None) -> QAPrompts:
    """Load QA templates (default: the packaged ``qa.yaml``); unknown keys are refused."""
    source = Path(path) if path else PROMPT_DIR / "qa.yaml"
    data = _read_yaml(source)
    known = {f.name for f in fields(QAPrompts)}
    if extra := sorted(set(data) - known):
        raise RagsieveError(f"{source}: unknown template key(s) {extra}; known: {sorted(known)}")
    try:
        return QAPrompts(**data)
    except TypeError as exc:
        raise RagsieveError(f"{source}: {exc}") from None


def first_line(text: str) -> str:
    """Models often continue after the answer; the first non-empty line is the answer."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""
