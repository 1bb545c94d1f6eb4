"""Verdict prompts as data: the per-dataset templates and where their label words sit.

The texts live in ``templates.yaml`` next to this file (prompts are data, not code).
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

TEMPLATE_FILE = Path(__file__).resolve().parent / "templates.yaml"
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
    """All templates by dataset name (default: the packaged ``templates.yaml``)."""
    import yaml

    source = Path(path) if path else TEMPLATE_FILE
    if not source.is_file():
        raise RagsieveError(f"template file not found: {source}")
    data = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise RagsieveError(f"{source}: expected a mapping of dataset names to templates")
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


@dataclass(frozen=True)
class VerdictTokens:
    """Token ids read for the two label words at the answer position.

    ``true_pieces`` / ``false_pieces`` are the full tokenisations; only the first
    token is scored, so ``multi_token`` flags words that are approximated that way.
    """

    true_id: int
    false_id: int
    true_pieces: tuple[int, ...]
    false_pieces: tuple[int, ...]

    @property
    def multi_token(self) -> bool:
        return len(self.true_pieces) > 1 or len(self.false_pieces) > 1

    def id_for(self, label: int) -> int:
        return self.true_id if label else self.false_id


def answer_tokens(tokenizer: "PreTrainedTokenizerBase", prompt: str, word: str) -> tuple[int, ...]:
    """The tokens ``word`` becomes when written right after ``prompt``.

    Tokenising ``prompt + word`` (not ``word`` alone) picks the variant the model
    actually produces there: no leading space after a chat template's newline, a
    space-prefixed token after plain text ending in a space, and so on.
    """
    base = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full = tokenizer(prompt + word, add_special_tokens=False)["input_ids"]
    if full[: len(base)] == base and len(full) > len(base):
        return tuple(full[len(base) :])
    # The word merged with the prompt's last token: fall back to the word on its own.
    return tuple(tokenizer(word, add_special_tokens=False)["input_ids"])


def verdict_tokens(
    tokenizer: "PreTrainedTokenizerBase", template: VerdictTemplate, format_prompt: Callable[[str], str]
) -> VerdictTokens:
    """Label-word token ids at the answer position of ``format_prompt`` (the chat template).

    Example::

        llm = load_local_llm()
        verdict_tokens(llm.tokenizer, get_template("hotpotqa-distractor"), llm.format_prompt)
        # VerdictTokens(true_id=2787, false_id=4245, ...)  "True" / "False", no leading space
    """
    probe_prompt = format_prompt(template.render({f: "x" for f in template.fields}))
    true_pieces = answer_tokens(tokenizer, probe_prompt, template.true_word)
    false_pieces = answer_tokens(tokenizer, probe_prompt, template.false_word)
    if not true_pieces or not false_pieces:
        raise RagsieveError(f"template '{template.name}': a label word tokenises to nothing")
    if true_pieces[0] == false_pieces[0]:
        raise RagsieveError(
            f"template '{template.name}': '{template.true_word}' and '{template.false_word}' share their first "
            f"token ({true_pieces[0]}), so one next-token distribution cannot tell them apart"
        )
    return VerdictTokens(true_pieces[0], false_pieces[0], true_pieces, false_pieces)
