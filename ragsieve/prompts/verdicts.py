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


def template_from_mapping(name: str, entry: object, source: str | Path) -> VerdictTemplate:
    """One template from its mapping (a ``verdicts.yaml`` entry or a user's file); one-line errors."""
    if not isinstance(entry, dict):
        raise RagsieveError(f"{source}: '{name}' should be a mapping with keys {list(_KEYS)}")
    if extra := sorted(set(entry) - set(_KEYS)):
        raise RagsieveError(f"{source}: '{name}' has unknown key(s) {extra}; known: {list(_KEYS)}")
    if missing := [k for k in _KEYS if k not in entry]:
        raise RagsieveError(f"{source}: '{name}' lacks key(s) {missing}")
    if bad := [k for k in _KEYS if not isinstance(entry[k], str) or not entry[k].strip()]:
        raise RagsieveError(f"{source}: '{name}'.{bad[0]} must be a non-empty string")
    t = VerdictTemplate(name=name, **{k: str(entry[k]) for k in _KEYS})
    try:
        fields = t.fields
    except ValueError as exc:  # an unbalanced brace: str.format would fail at the first prompt
        raise RagsieveError(f"{source}: '{name}'.template is not a valid format string ({exc})") from None
    if any(not f.isidentifier() for f in fields):
        raise RagsieveError(f"{source}: '{name}'.template slots must be plain names, got {list(fields)}")
    for key in ("truncate", "query_field", "passage_field"):
        if getattr(t, key) not in fields:
            raise RagsieveError(f"{source}: '{name}'.{key} = '{getattr(t, key)}' is not a template field {fields}")
    if t.query_field == t.passage_field:
        raise RagsieveError(f"{source}: '{name}': query_field and passage_field must be different slots")
    if t.true_word.strip().lower() == t.false_word.strip().lower():
        raise RagsieveError(f"{source}: '{name}': true_word and false_word must differ")
    return t


@lru_cache(maxsize=4)
def load_templates(path: str | None = None) -> dict[str, VerdictTemplate]:
    """All templates by dataset name (default: the packaged ``verdicts.yaml``)."""
    from ragsieve.config import read_mapping

    source = Path(path) if path else TEMPLATE_FILE
    data = read_mapping(source, "verdict template")  # UTF-8 policy, one-line errors
    return {name: template_from_mapping(name, entry, source) for name, entry in data.items()}


def get_template(name: str, path: str | None = None) -> VerdictTemplate:
    templates = load_templates(path)
    try:
        return templates[name]
    except KeyError:
        raise RagsieveError(f"no verdict template '{name}'; known: {', '.join(sorted(templates))}") from None


#: the generic template for a user's own (query, passage, label) rows
GENERIC_TEMPLATE = "relevance"


def load_template_file(path: str | Path) -> VerdictTemplate:
    """A user's verdict template: a YAML/JSON mapping with the keys of a ``verdicts.yaml`` entry.

    ``query_field`` / ``passage_field`` default to ``query`` / ``passage`` and ``truncate``
    to the passage field, so the smallest file is a ``template`` with ``{query}`` and
    ``{passage}`` plus the two label words. It is named after the file's stem.

    Example::

        # my_template.yaml
        template: "Does the passage answer the question? Question: {query} Passage: {passage} Answer:"
        true_word: "yes"
        false_word: "no"
    """
    from ragsieve.config import read_mapping

    entry = read_mapping(path, "verdict template")
    entry.setdefault("query_field", "query")
    entry.setdefault("passage_field", "passage")
    if isinstance(entry.get("passage_field"), str):
        entry.setdefault("truncate", entry["passage_field"])
    return template_from_mapping(Path(path).stem, entry, path)


def resolve_template(spec: str) -> VerdictTemplate:
    """A packaged template by name (``relevance``, ``fever``, ...) or a user's YAML/JSON file."""
    if Path(spec).suffix.lower() in (".yaml", ".yml", ".json") or Path(spec).is_file():
        return load_template_file(spec)
    return get_template(spec)


def template_mapping(template: VerdictTemplate) -> dict[str, str]:
    """The template's keys as saved in a store (so the store does not depend on the user's file)."""
    return {k: getattr(template, k) for k in _KEYS}


def stored_template(name: str, spec: Mapping[str, str] | None) -> VerdictTemplate:
    """A store's template: its saved mapping when it has one (a user's file), else the packaged one."""
    return template_from_mapping(name, dict(spec), "evolve store") if spec else get_template(name)


def check_single_token_words(
    tokenizer: "PreTrainedTokenizerBase", template: VerdictTemplate, format_prompt: Callable[[str], str]
) -> None:
    """Refuse label words that are not ONE token at the answer position of this LLM.

    The packaged templates may use multi-token words (scored by their first token, see
    ``verdicts.yaml``); a user's template must not, so its verdict is exactly P(word).
    """
    from ragsieve.models.verdict import answer_tokens

    prompt = format_prompt(template.render({f: "x" for f in template.fields}))
    for key in ("true_word", "false_word"):
        word = getattr(template, key)
        pieces = answer_tokens(tokenizer, prompt, word)
        if len(pieces) != 1:
            raise RagsieveError(
                f"template '{template.name}': {key} '{word}' is {len(pieces)} tokens for this LLM's tokenizer; "
                "use a single-token word (e.g. true/false, yes/no)"
            )
    verdict_tokens(tokenizer, template, format_prompt)  # the two first tokens must differ too


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
