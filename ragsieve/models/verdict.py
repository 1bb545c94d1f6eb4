"""Reading a yes/no (true/false) verdict off a causal LM's next token: the one implementation.

The relevance graders (configs A / prompted), the pointwise LLM reranker, the evolving
reranker's SFT / DPO losses and the LLM judges all score a (query, passage) pair the same
way: fill a prompt, left-pad a batch, run one forward with only the last position's
logits, and compare the probability mass of the "true" token(s) with the "false" ones.

* :class:`VerdictTokens` — which token ids mean true / false at the answer position;
* :func:`left_pad` — a batch whose last column is every row's last prompt token, with
  position ids counted over real tokens (a padded row scores like the prompt alone);
* :func:`answer_logits`, :func:`verdict_log_probs`, :func:`two_way_logits` — the readers;
* :class:`VerdictScores` and :func:`score_verdicts` — batched, length-sorted scoring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ragsieve.errors import RagsieveError
from ragsieve.progress import report

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class VerdictTokens:
    """Token ids whose next-token probability mass means "true" / "false".

    ``true_ids[0]`` / ``false_ids[0]`` are the canonical targets a model learns to emit;
    further ids are single-token spelling variants pooled into the score ("yes", "Yes",
    "YES"). ``true_pieces`` / ``false_pieces`` are the full tokenisations of the
    canonical words: only their first token is scored, so ``multi_token`` flags words
    that are approximated that way.

    Example::

        >>> t = VerdictTokens((5, 6), (7,))
        >>> t.true_id, t.id_for(0), t.multi_token
        (5, 7, False)
    """

    true_ids: tuple[int, ...]
    false_ids: tuple[int, ...]
    true_pieces: tuple[int, ...] = ()
    false_pieces: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.true_ids or not self.false_ids:
            raise RagsieveError("a verdict needs at least one true and one false token")
        if set(self.true_ids) & set(self.false_ids):
            raise RagsieveError(f"true tokens {self.true_ids} and false tokens {self.false_ids} overlap")

    @property
    def true_id(self) -> int:
        return self.true_ids[0]

    @property
    def false_id(self) -> int:
        return self.false_ids[0]

    @property
    def multi_token(self) -> bool:
        return len(self.true_pieces) > 1 or len(self.false_pieces) > 1

    def id_for(self, label: int) -> int:
        """The canonical target token for a label (1 = true)."""
        return self.true_id if label else self.false_id

    @classmethod
    def for_words(
        cls, tokenizer: "PreTrainedTokenizerBase", true_words: Sequence[str], false_words: Sequence[str]
    ) -> "VerdictTokens":
        """Pool every single-token spelling of the words (the first word may be multi-token: its first piece)."""

        def single(words: Sequence[str]) -> tuple[int, ...]:
            ids = []
            for i, word in enumerate(words):
                tokens = tokenizer(word, add_special_tokens=False)["input_ids"]
                if len(tokens) == 1 or (i == 0 and tokens):
                    ids.append(tokens[0])
            return tuple(dict.fromkeys(ids))

        true_ids, false_ids = single(true_words), single(false_words)
        if not true_ids or not false_ids or set(true_ids) & set(false_ids):
            raise RagsieveError(
                f"this tokenizer cannot tell '{true_words[0]}' from '{false_words[0]}' by their first token"
            )
        return cls(true_ids, false_ids)

    @classmethod
    def at_answer(
        cls, tokenizer: "PreTrainedTokenizerBase", prompt: str, true_word: str, false_word: str
    ) -> "VerdictTokens":
        """The ids the two words start with when written right after ``prompt`` (a formatted prompt)."""
        true_pieces = answer_tokens(tokenizer, prompt, true_word)
        false_pieces = answer_tokens(tokenizer, prompt, false_word)
        if not true_pieces or not false_pieces:
            raise RagsieveError(f"label word '{true_word}' or '{false_word}' tokenises to nothing")
        if true_pieces[0] == false_pieces[0]:
            raise RagsieveError(
                f"'{true_word}' and '{false_word}' share their first token ({true_pieces[0]}), so one "
                "next-token distribution cannot tell them apart"
            )
        return cls((true_pieces[0],), (false_pieces[0],), true_pieces, false_pieces)


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


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> dict[str, "torch.Tensor"]:
    """Left-padded ``input_ids`` + mask, with position ids from the mask (as ``generate`` builds them).

    With these position ids a padded row gives the same last-position logits as the
    prompt alone (up to float noise), so batching never changes a score.
    """
    import torch

    if not rows:
        raise RagsieveError("empty batch")
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(list(r), dtype=torch.long)
            mask[i, width - len(r) :] = 1
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def tokenize_prompts(tokenizer: "PreTrainedTokenizerBase", prompts: Sequence[str]) -> list[list[int]]:
    """Token ids of already formatted prompts (the chat template added its own special tokens)."""
    return tokenizer(list(prompts), add_special_tokens=False)["input_ids"]


def left_pad_prompts(tokenizer: "PreTrainedTokenizerBase", prompts: Sequence[str]) -> dict[str, "torch.Tensor"]:
    """:func:`left_pad` over formatted prompt strings."""
    return left_pad(tokenize_prompts(tokenizer, prompts), tokenizer.pad_token_id)


def answer_logits(model, batch: Mapping[str, "torch.Tensor"]) -> "torch.Tensor":
    """Next-token logits at the last prompt position, shape (batch, vocab), float32.

    Only that position's logits are computed (``logits_to_keep=1``), so a batch costs one
    forward without the vocabulary projection at every position.
    """
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
    out = model(**inputs, logits_to_keep=1, use_cache=False)
    return out.logits[:, -1, :].float()


def two_way_logits(vocab_logits: "torch.Tensor", tokens: VerdictTokens) -> "torch.Tensor":
    """``(N, vocab)`` logits → ``(N, 2)`` = [log-mass of false, log-mass of true] (a 2-class logit)."""
    import torch

    false = torch.logsumexp(vocab_logits[:, list(tokens.false_ids)], dim=-1)
    true = torch.logsumexp(vocab_logits[:, list(tokens.true_ids)], dim=-1)
    return torch.stack([false, true], dim=-1)


def verdict_log_probs(
    model, batch: Mapping[str, "torch.Tensor"], tokens: VerdictTokens
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """log P(true), log P(false) over the full vocabulary (DPO reads these): one forward for both."""
    pair = two_way_logits(answer_logits(model, batch).log_softmax(-1), tokens)
    return pair[:, 1], pair[:, 0]


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


def score_verdicts(
    model, tokens: VerdictTokens, rows: Sequence[Sequence[int]], pad_id: int, batch_size: int = 8
) -> VerdictScores:
    """Verdict log-probs for tokenised prompts, in length-sorted batches (less padding), no grad."""
    import torch

    logp_true = np.zeros(len(rows), dtype=np.float64)
    logp_false = np.zeros(len(rows), dtype=np.float64)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for lo in range(0, len(order), batch_size):
                idx = order[lo : lo + batch_size]
                t, f = verdict_log_probs(model, left_pad([rows[i] for i in idx], pad_id), tokens)
                logp_true[idx] = t.double().numpy()
                logp_false[idx] = f.double().numpy()
                report("score", min(lo + batch_size, len(order)), len(order))
    finally:
        model.train(was_training)
    return VerdictScores(logp_true, logp_false)
