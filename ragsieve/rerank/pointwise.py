"""Pointwise LLM reranker: P(true word) vs P(false word) at the answer position.

For a (query, passage) pair the dataset's verdict template is filled, wrapped in the
chat template, and the causal LM's next-token distribution at the answer position is
read at the two label-word tokens (see :mod:`ragsieve.models.verdict`):

    score = P(true) / (P(true) + P(false)),   confidence = max(score, 1 - score)

``load_reranker("pointwise:<template>")`` builds one; the evolving reranker trains its
LoRA deltas (:mod:`ragsieve.evolve`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Union

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.data.records import LabeledPair
from ragsieve.models.verdict import VerdictScores, score_verdicts, tokenize_prompts
from ragsieve.prompts.verdicts import VerdictTemplate, get_template, verdict_tokens
from ragsieve.models.specs import DEFAULT_LLM
from ragsieve.rerank.base import BaseRanker, as_passages

if TYPE_CHECKING:

    from ragsieve.models.llm import LocalLLM

FieldsLike = Union[Mapping[str, str], LabeledPair]


class VerdictPrompter:
    """Fills a template within a token budget and applies the chat template.

    Only the template's ``truncate`` field is cut; the instruction and the query never are.

    Example::

        prompter = VerdictPrompter(load_local_llm(), get_template("fever"), max_prompt_tokens=256)
        prompter.prompt({"claim": "...", "evidence": "..."})
    """

    def __init__(self, llm: "LocalLLM", template: VerdictTemplate, max_prompt_tokens: int = 384):
        self.llm = llm
        self.template = template
        self.max_prompt_tokens = max_prompt_tokens
        self.truncated = 0

    def user_message(self, fields: Mapping[str, str]) -> str:
        t = self.template
        overhead = self.llm.count_tokens(self.llm.format_prompt(t.render({**fields, t.truncate: ""})))
        budget = self.max_prompt_tokens - overhead
        if budget < 8:
            raise RagsieveError(
                f"max_prompt_tokens={self.max_prompt_tokens} leaves {budget} tokens for '{t.truncate}' in "
                f"template '{t.name}'; raise it"
            )
        text, cut = self.llm.truncate_tokens(fields[t.truncate], budget)
        self.truncated += int(cut)
        return t.render({**fields, t.truncate: text})

    def prompt(self, fields: Mapping[str, str]) -> str:
        return self.llm.format_prompt(self.user_message(fields))


def _fields(item: FieldsLike) -> Mapping[str, str]:
    return item.fields if isinstance(item, LabeledPair) else item


class PointwiseLLMReranker(BaseRanker):
    """Any local causal LM as a pointwise verdict model and reranker.

    ``template`` is a dataset name in ``verdicts.yaml`` (``load_reranker("pointwise:<template>")``);
    ``llm`` a loaded :class:`~ragsieve.models.llm.LocalLLM` or a spec (default: the embedded SmolLM2); ``adapters``
    LoRA adapter folders merged in order (an evolved model is base ⊕ Δ0 ⊕ … ⊕ Δt).

    Example::

        ranker = PointwiseLLMReranker(template="hotpotqa-distractor")
        ranker.rank("Who directed Jaws?", ["Jaws is a 1975 film by Steven Spielberg.", "Paris is in France."])
        ranker.predict([{"question": "Who directed Jaws?", "sentence": "Spielberg directed it."}]).score
    """

    name = "pointwise-llm"
    #: P(true) / (P(true) + P(false)): served as is in [0, 1], calibrated on its logit
    score_is_probability = True

    def __init__(
        self,
        template: VerdictTemplate | str = "hotpotqa-distractor",
        llm: "LocalLLM | str" = DEFAULT_LLM,
        *,
        adapters: Sequence[str | Path] = (),
        max_prompt_tokens: int = 384,
        batch_size: int = 8,
    ):
        from ragsieve.models.llm import load_local_llm

        self.llm = load_local_llm(llm) if isinstance(llm, str) else llm
        self.template = get_template(template) if isinstance(template, str) else template
        self.tokens = verdict_tokens(self.llm.tokenizer, self.template, self.llm.format_prompt)
        self.prompter = VerdictPrompter(self.llm, self.template, max_prompt_tokens)
        self.batch_size = batch_size
        if adapters:
            from ragsieve.models.lora import merge_adapter

            for path in adapters:
                merge_adapter(self.llm, path)

    @property
    def model(self):
        return self.llm.model

    def prompts(self, items: Sequence[FieldsLike]) -> list[str]:
        return [self.prompter.prompt(_fields(x)) for x in items]

    def verdicts_for_prompts(self, prompts: Sequence[str], model=None) -> VerdictScores:
        """Batched verdict log-probs for already formatted prompts."""
        model = model if model is not None else self.llm.model
        rows = tokenize_prompts(self.llm.tokenizer, prompts)
        return score_verdicts(model, self.tokens, rows, self.llm.tokenizer.pad_token_id, self.batch_size)

    def predict(self, items: Sequence[FieldsLike]) -> VerdictScores:
        """Verdicts for examples or field mappings of this template."""
        return self.verdicts_for_prompts(self.prompts(items))

    def score_pairs(self, queries: Sequence[str], passages: Sequence[Passage | str]) -> np.ndarray:
        """P(true) for aligned pairs, batched across queries (the passage text fills the passage field)."""
        if len(queries) != len(passages):
            raise RagsieveError(f"got {len(queries)} queries but {len(passages)} passages")
        items = as_passages(passages)
        return self.predict([self.template.fields_for(q, p.text) for q, p in zip(queries, items)]).score
