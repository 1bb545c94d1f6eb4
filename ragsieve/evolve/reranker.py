"""Pointwise LLM reranker: P(true word) vs P(false word) at the answer position.

For a (query, passage) pair the dataset's verdict template is filled, wrapped in the
chat template, and the causal LM's next-token distribution at the answer position is
read at the two label-word tokens (see :func:`~ragsieve.evolve.templates.verdict_tokens`):

    score = P(true) / (P(true) + P(false)),   confidence = max(score, 1 - score)

Only the last position's logits are computed (``logits_to_keep=1``), so a batch costs
one forward without the 49k-vocabulary output layer at every position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.evolve.tasks import VerdictExample
from ragsieve.evolve.templates import VerdictTemplate, VerdictTokens, get_template, verdict_tokens
from ragsieve.models.specs import DEFAULT_LLM
from ragsieve.rerank.base import BaseRanker

if TYPE_CHECKING:
    import torch

    from ragsieve.models.llm import LocalLLM

FieldsLike = Union[Mapping[str, str], VerdictExample]


@dataclass
class VerdictScores:
    """Per-example verdicts; the log-probs are over the full vocabulary (DPO reads them).

    Example::

        >>> s = VerdictScores(np.log([0.6, 0.1]), np.log([0.2, 0.3]))
        >>> s.score.round(2).tolist(), s.confidence.round(2).tolist(), s.predictions.tolist()
        ([0.75, 0.25], [0.75, 0.75], [1, 0])
    """

    logp_true: np.ndarray
    logp_false: np.ndarray

    @property
    def score(self) -> np.ndarray:
        """P(true) / (P(true) + P(false)) = sigmoid(logp_true - logp_false)."""
        return 1.0 / (1.0 + np.exp(self.logp_false - self.logp_true))

    @property
    def confidence(self) -> np.ndarray:
        s = self.score
        return np.maximum(s, 1.0 - s)

    @property
    def predictions(self) -> np.ndarray:
        return (self.score >= 0.5).astype(np.int64)

    def __len__(self) -> int:
        return len(self.logp_true)

    def subset(self, index: Sequence[int]) -> "VerdictScores":
        idx = np.asarray(index, dtype=np.int64)
        return VerdictScores(self.logp_true[idx], self.logp_false[idx])


def encode_left_padded(tokenizer, prompts: Sequence[str]) -> dict[str, "torch.Tensor"]:
    """Left-padded batch with position ids from the mask, as ``generate`` builds them.

    With these position ids a padded row gives the same last-position logits as the
    prompt alone (up to float noise).
    """
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    mask = enc["attention_mask"]
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": position_ids}


def answer_logits(model, batch: Mapping[str, "torch.Tensor"]) -> "torch.Tensor":
    """Next-token logits at the last prompt position, shape (batch, vocab), float32."""
    out = model(**batch, logits_to_keep=1, use_cache=False)
    return out.logits[:, -1, :].float()


def verdict_logps(model, batch: Mapping[str, "torch.Tensor"], tokens: VerdictTokens) -> tuple["torch.Tensor", "torch.Tensor"]:
    """log P(true token), log P(false token) over the full vocabulary: one forward for both."""
    logps = answer_logits(model, batch).log_softmax(-1)
    return logps[:, tokens.true_id], logps[:, tokens.false_id]


def batched_verdicts(
    model, tokenizer, tokens: VerdictTokens, prompts: Sequence[str], batch_size: int = 8
) -> VerdictScores:
    """Verdict log-probs for formatted prompts, in length-sorted batches (less padding), no grad."""
    import torch

    logp_true = np.zeros(len(prompts), dtype=np.float64)
    logp_false = np.zeros(len(prompts), dtype=np.float64)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for lo in range(0, len(order), batch_size):
                idx = order[lo : lo + batch_size]
                t, f = verdict_logps(model, encode_left_padded(tokenizer, [prompts[i] for i in idx]), tokens)
                logp_true[idx] = t.double().numpy()
                logp_false[idx] = f.double().numpy()
    finally:
        model.train(was_training)
    return VerdictScores(logp_true, logp_false)


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
    return item.fields if isinstance(item, VerdictExample) else item


class PointwiseLLMReranker(BaseRanker):
    """Any local causal LM as a pointwise verdict model and reranker.

    ``llm`` is a loaded :class:`~ragsieve.models.llm.LocalLLM` or a spec (default: the
    embedded SmolLM2); ``template`` a dataset name in ``templates.yaml``; ``adapters``
    LoRA adapter folders merged in order (an evolved model is base ⊕ Δ0 ⊕ … ⊕ Δt).

    Example::

        ranker = PointwiseLLMReranker(template="hotpotqa-distractor")
        ranker.rank("Who directed Jaws?", ["Jaws is a 1975 film by Steven Spielberg.", "Paris is in France."])
        ranker.predict([{"question": "Who directed Jaws?", "sentence": "Spielberg directed it."}]).score
    """

    name = "pointwise-llm"

    def __init__(
        self,
        llm: "LocalLLM | str" = DEFAULT_LLM,
        template: VerdictTemplate | str = "hotpotqa-distractor",
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
            from ragsieve.evolve.lora import merge_adapter

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
        return batched_verdicts(model, self.llm.tokenizer, self.tokens, prompts, self.batch_size)

    def predict(self, items: Sequence[FieldsLike]) -> VerdictScores:
        """Verdicts for examples or field mappings of this template."""
        return self.verdicts_for_prompts(self.prompts(items))

    def score(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        fields = [self.template.fields_for(query, p.text) for p in passages]
        return self.predict(fields).score
