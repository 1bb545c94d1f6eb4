"""The grading prompt, its token budget, and the yes/no verdict (tokens and parsing).

Every LLM-based grader and the LLM judge ask the same question, so a grader trained on
judge labels sees exactly the prompt the judge answered. The prompt is assembled as
token ids (prefix + passage + suffix), so the passage is cut to an exact token budget
and the prompt never exceeds ``max_length``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ragsieve.errors import RagsieveError
from ragsieve.models.verdict import VerdictTokens

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

INSTRUCTION = (
    "Analyze the DOCUMENT and determine whether it is relevant to answering the QUESTION. "
    "Answer with one word: yes or no."
)
SYSTEM = "You grade whether a document is relevant to a question."
# Marks where the passage goes in the rendered chat template; never appears in real text.
_PASSAGE_SLOT = "\x00PASSAGE\x00"


def user_message(query: str, passage: str, instruction: str = INSTRUCTION) -> str:
    """The judge/grader question for one pair (also what an endpoint judge receives)."""
    return f"{instruction}\n\nQUESTION: {query}\n\nDOCUMENT:\n{passage}"


@dataclass(frozen=True)
class EncodedPrompt:
    """Token ids of one grading prompt and what had to be cut to fit."""

    input_ids: list[int]
    passage_truncated: bool
    query_truncated: bool


class GradePromptEncoder:
    """Turns (query, passage) into chat-formatted token ids within a token budget.

    The passage keeps at most ``max_passage_tokens`` tokens and is cut further if the
    whole prompt would exceed ``max_length``; the query keeps at most
    ``max_query_tokens``. Cuts are reported, never silent.

    Example::

        enc = GradePromptEncoder(tokenizer, max_length=512, max_passage_tokens=256)
        prompt = enc.encode("who wrote hamlet?", "Hamlet is a tragedy by Shakespeare.")
        tokenizer.decode(prompt.input_ids)
    """

    def __init__(
        self,
        tokenizer: "PreTrainedTokenizerBase",
        *,
        max_length: int = 512,
        max_passage_tokens: int = 384,
        max_query_tokens: int = 96,
        system: str = SYSTEM,
        instruction: str = INSTRUCTION,
    ):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.max_passage_tokens = max_passage_tokens
        self.max_query_tokens = max_query_tokens
        self.system = system
        self.instruction = instruction

    def _render(self, query: str) -> tuple[str, str]:
        message = user_message(query, _PASSAGE_SLOT, self.instruction)
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "system", "content": self.system}, {"role": "user", "content": message}]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:  # plain LMs: the same layout LocalLLM.format_prompt uses
            text = f"{self.system}\n\n{message}\n"
        prefix, _, suffix = text.partition(_PASSAGE_SLOT)
        return prefix, suffix

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode(self, query: str, passage: str) -> EncodedPrompt:
        query_ids = self._ids(query)
        query_truncated = len(query_ids) > self.max_query_tokens
        if query_truncated:
            query = self.tokenizer.decode(query_ids[: self.max_query_tokens])
        prefix, suffix = self._render(query)
        prefix_ids, suffix_ids = self._ids(prefix), self._ids(suffix)
        budget = min(self.max_passage_tokens, self.max_length - len(prefix_ids) - len(suffix_ids))
        if budget < 1:
            raise RagsieveError(
                f"grading prompt needs {len(prefix_ids) + len(suffix_ids) + 1} tokens but max_length is "
                f"{self.max_length}; raise max_length"
            )
        passage_ids = self._ids(passage)
        return EncodedPrompt(
            prefix_ids + passage_ids[:budget] + suffix_ids,
            passage_truncated=len(passage_ids) > budget,
            query_truncated=query_truncated,
        )


# -- verdict tokens ---------------------------------------------------------------

YES_WORDS = ("yes", "Yes", "YES")
NO_WORDS = ("no", "No", "NO")


def grade_verdict_tokens(tokenizer: "PreTrainedTokenizerBase") -> VerdictTokens:
    """The yes / no tokens every LLM grader reads ("yes" and "no" first: the targets config A learns)."""
    return VerdictTokens.for_words(tokenizer, YES_WORDS, NO_WORDS)


_WORD = re.compile(r"[a-z]+")
_POSITIVE = {"yes", "relevant", "true"}
_NEGATIVE = {"no", "irrelevant", "false", "unrelated"}


def parse_verdict(answer: str) -> int | None:
    """1 for a yes/relevant answer, 0 for no/not relevant, None if neither can be read.

    The first verdict word decides, and "not relevant" counts as no.

    >>> parse_verdict("Yes."), parse_verdict("No, it is about cats."), parse_verdict("It is not relevant")
    (1, 0, 0)
    >>> parse_verdict("The document is relevant"), parse_verdict("I cannot tell") is None
    (1, True)
    """
    words = _WORD.findall((answer or "").lower())
    for i, word in enumerate(words):
        if word == "not" and i + 1 < len(words) and words[i + 1] in _POSITIVE:
            return 0
        if word in _POSITIVE:
            return 1
        if word in _NEGATIVE:
            return 0
    return None
