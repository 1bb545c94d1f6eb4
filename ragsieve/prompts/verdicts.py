"""Verdict prompts as data: the per-dataset templates and where their label words sit.

The texts live in ``verdicts.yaml`` next to this file (prompts are data, not code).
:func:`verdict_tokens` finds the token ids a reranker reads for the two label words at
the answer position of a given tokenizer and chat template.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from ragsieve.errors import RagsieveError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ragsieve.models.verdict import VerdictTokens

TEMPLATE_FILE = Path(__file__).resolve().parent / "verdicts.yaml"
_KEYS = ("template", "true_word", "false_word", "truncate", "query_field", "passage_field")


@dataclass(frozen=True)
class VerdictTemplate:
    """One dataset's prompt and label words.

    Example::

        t = load_templates()["pubmedqa"]
        t.render({"question": "Does X cause Y?", "context": "We found that X causes Y."})
    """

    name: str
    template: str
    true_word: str
    false_word: str
    truncate: str
    query_field: str
    passage_field: str

    @property
    def fields(self) -> tuple[str, ...]:
        """The placeholders the template needs, in order of appearance."""
        return tuple(dict.fromkeys(f for _, f, _, _ in string.Formatter().parse(self.template) if f))

    def label_word(self, label: int) -> str:
        return self.true_word if label else self.false_word

    def render(self, fields: Mapping[str, str]) -> str:
        missing = [f for f in self.fields if f not in fields]
        if missing:
            raise RagsieveError(f"template '{self.name}' needs field(s) {missing}; got {sorted(fields)}")
        return self.template.format(**{f: fields[f] for f in self.fields})

    def fields_for(self, query: str, passage: str) -> dict[str, str]:
        """Fields for a plain (query, passage) pair, the shape a reranker is called with."""
        return {self.query_field: query, self.passage_field: passage}


@lru_cache(maxsize=4)
def load_templates(path: str | None = None) -> dict[str, VerdictTemplate]:
    """All templates by dataset name (default: the packaged ``verdicts.yaml``)."""
    from ragsieve.config import read_mapping

    source = Path(path) if path else TEMPLATE_FILE
    data = read_mapping(source, "verdict template")  # UTF-8 policy, one-line errors
    out = {}
    for name, entry in data.items():
        if not isinstance(entry, dict):
            raise RagsieveError(f"{source}: '{name}' should be a mapping with keys {list(_KEYS)}")
        if extra := sorted(set(entry) - set(_KEYS)):
            raise RagsieveError(f"{source}: '{name}' has unknown key(s) {extra}; known: {list(_KEYS)}")
        if missing := [k for k in _KEYS if k not in entry]:
            raise RagsieveError(f"{source}: '{name}' lacks key(s) {missing}")
        t = VerdictTemplate(name=name, **{k: str(entry[k]) for k in _KEYS})
        for key in ("truncate", "query_field", "passage_field"):
            if getattr(t, key) not in t.fields:
                raise RagsieveError(f"{source}: '{name}'.{key} = '{getattr(t, key)}' is not a template field {t.fields}")
        out[name] = t
    return out


def get_template(name: str, path: str | None = None) -> VerdictTemplate:
    templates = load_templates(path)
    try:
        return templates[name]
    except KeyError:
        raise RagsieveError(f"no verdict template '{name}'; known: {', '.join(sorted(templates))}") from None


def verdict_tokens(
    tokenizer: "PreTrainedTokenizerBase", template: VerdictTemplate, format_prompt: Callable[[str], str]
) -> "VerdictTokens":
    """Label-word token ids at the answer position of ``format_prompt`` (the chat template).

    Example::

        llm = load_local_llm()
        verdict_tokens(llm.tokenizer, get_template("hotpotqa-distractor"), llm.format_prompt)
        # VerdictTokens(true_id=2787, false_id=4245, ...)  "True" / "False", no leading space
    """
    from ragsieve.models.verdict import VerdictTokens

    probe_prompt = format_prompt(template.render({f: "x" for f in template.fields}))
    try:
        return VerdictTokens.at_answer(tokenizer, probe_prompt, template.true_word, template.false_word)
    except RagsieveError as exc:
        raise RagsieveError(f"template '{template.name}': {exc}") from None
