"""Fill the QA templates within a token budget.

Shared by the probe (which must score exactly the prompts the LLM answers) and the
RAG pipeline. Contexts are truncated to fit; the instruction and question never are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.prompts import QAPrompts, load_qa_prompts

if TYPE_CHECKING:
    from ragsieve.models.llm import Generator


#: where the best passage goes in the prompt: first (rank order) or last (next to the question)
PASSAGE_ORDERS = ("best_first", "best_last")


def in_prompt_order(passages: Sequence[Passage], order: str = "best_first") -> list[Passage]:
    """Passages given best first, as the prompt lists them: unchanged, or reversed for ``best_last``.

    A small LLM may use a passage better when it sits next to the question; ``ragsieve fit``
    chooses the order by the LLM's answers.
    """
    if order not in PASSAGE_ORDERS:
        raise RagsieveError(f"passage order '{order}': use {' or '.join(PASSAGE_ORDERS)}")
    return list(passages)[::-1] if order == "best_last" else list(passages)


@dataclass
class BuiltPrompt:
    text: str
    truncated_contexts: int = 0


class PromptBuilder:
    """Fills the QA templates within ``max_prompt_tokens``.

    When contexts do not fit, each is cut to an equal share of the remaining budget:
    the instruction and question are never truncated. ``count_tokens`` / ``truncate``
    come from the LLM's tokenizer (a char-based estimate for remote endpoints).
    """

    def __init__(self, llm: "Generator", prompts: QAPrompts | None = None, max_prompt_tokens: int = 1024):
        self.llm = llm
        self.prompts = prompts or load_qa_prompts()
        self.max_prompt_tokens = max_prompt_tokens

    def _count(self, text: str) -> int:
        counter = getattr(self.llm, "count_tokens", None)
        return counter(text) if counter else max(1, len(text) // 4)

    def _truncate(self, text: str, max_tokens: int) -> tuple[str, bool]:
        cutter = getattr(self.llm, "truncate_tokens", None)
        if cutter:
            return cutter(text, max_tokens)
        limit = max_tokens * 4
        return (text[:limit], True) if len(text) > limit else (text, False)

    def closed_book(self, question: str) -> BuiltPrompt:
        return BuiltPrompt(self.prompts.closed_book.format(question=question))

    def to_chat(self, user_text: str) -> str:
        """The string the LLM is fed for a user message: chat template and system prompt included.

        Remote endpoints apply their own template; the plain join only serves token counting.
        """
        fmt = getattr(self.llm, "format_prompt", None)
        return fmt(user_text, self.prompts.system) if fmt else f"{self.prompts.system}\n{user_text}"

    def chat_prompt(self, question: str, contexts: Sequence[Passage] = ()) -> str:
        """The exact prompt a local LLM answers for (question, contexts); what the probe reads."""
        return self.to_chat(self.with_context(question, contexts).text)

    def prompt_tokens(self, user_text: str) -> int:
        """Tokens the LLM reads for this user message (chat template and system prompt included)."""
        return self._prompt_tokens(user_text)

    def _prompt_tokens(self, user_text: str) -> int:
        """Tokens of the prompt as the LLM sees it: chat template and system prompt included."""
        return self._count(self.to_chat(user_text))

    def _render(self, question: str, contexts: Sequence[Passage], texts: Sequence[str]) -> str:
        items = [
            self.prompts.context_item.format(index=i + 1, title=p.title, text=t)
            for i, (p, t) in enumerate(zip(contexts, texts))
        ]
        return self.prompts.with_context.format(question=question, contexts=self.prompts.context_separator.join(items))

    def with_context(self, question: str, contexts: Sequence[Passage]) -> BuiltPrompt:
        if not contexts:
            return self.closed_book(question)
        overhead = self._prompt_tokens(self._render(question, contexts, [""] * len(contexts)))
        budget = self.max_prompt_tokens - overhead
        if budget < 8 * len(contexts):
            raise RagsieveError(
                f"question too long for max_prompt_tokens={self.max_prompt_tokens} "
                f"({overhead} tokens before any context); raise the limit or shorten it"
            )
        share = budget // len(contexts)
        for _ in range(4):
            cuts = [self._truncate(p.text, share) for p in contexts]
            text = self._render(question, contexts, [c[0] for c in cuts])
            # Re-tokenising cut text at the joins can cost a few extra tokens: shave and retry.
            excess = self._prompt_tokens(text) - self.max_prompt_tokens
            if excess <= 0:
                break
            share = max(1, share - (excess + len(contexts) - 1) // len(contexts) - 1)
        return BuiltPrompt(text, sum(c[1] for c in cuts))
