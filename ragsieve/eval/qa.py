"""SQuAD-style answer normalisation and answer-level QA metrics.

Normalisation follows the official SQuAD v1.1 script (lower-case, delete ASCII
punctuation, drop the articles a/an/the, collapse whitespace) so numbers are comparable
with published EM/F1. Punctuation is deleted, not replaced by a space: "U.S." -> "us",
"well-known" -> "wellknown". Non-ASCII punctuation (curly quotes, en dashes) is kept,
as in the official script.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

from ragsieve.errors import DataError

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, strip punctuation and articles, collapse whitespace.

    >>> normalize_answer("The  Eiffel-Tower, in PARIS!")
    'eiffeltower in paris'
    """
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _as_golds(golds: Sequence[str] | str) -> list[str]:
    # A bare string would otherwise be iterated character by character.
    return [golds] if isinstance(golds, str) else list(golds)


def exact_match(pred: str, golds: Sequence[str] | str) -> bool:
    """True if the normalised prediction equals any normalised gold answer.

    >>> exact_match("the Beatles", ["Beatles", "The Fab Four"])
    True
    """
    norm_pred = normalize_answer(pred)
    return any(norm_pred == normalize_answer(g) for g in _as_golds(golds))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        # SQuAD v2 rule: two empty answers agree; otherwise nothing overlaps.
        return float(pred_tokens == gold_tokens)
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(pred: str, golds: Sequence[str] | str) -> float:
    """Bag-of-tokens F1 between prediction and gold, maximised over golds (0.0 if none).

    >>> round(token_f1("Paris France", ["Paris"]), 4)  # P = 1/2, R = 1/1
    0.6667
    """
    pred_tokens = normalize_answer(pred).split()
    return max(
        (_f1(pred_tokens, normalize_answer(g).split()) for g in _as_golds(golds)),
        default=0.0,
    )


def contains_answer(pred: str, golds: Sequence[str] | str) -> bool:
    """True if some normalised gold occurs in the normalised prediction as whole tokens.

    Golds that normalise to nothing (e.g. "the") never match; no golds -> False.

    >>> contains_answer("It was none of them", ["one"]), contains_answer("Number one!", ["One"])
    (False, True)
    """
    padded_pred = f" {normalize_answer(pred)} "
    for gold in _as_golds(golds):
        norm_gold = normalize_answer(gold)
        if norm_gold and f" {norm_gold} " in padded_pred:
            return True
    return False


def qa_metrics(preds: Sequence[str], golds: Sequence[Sequence[str]]) -> dict[str, float | int]:
    """Mean containment accuracy, EM and token F1 over a set of questions.

    Args:
        preds: one predicted answer (or generated text) per question.
        golds: the acceptable answers per question.

    Returns:
        ``{"accuracy": ..., "em": ..., "f1": ..., "n": ...}``; ``accuracy`` is
        :func:`contains_answer` (the usual open-domain "answer in generation" score).

    >>> qa_metrics(["Paris", "it is London"], [["Paris"], ["London"]])
    {'accuracy': 1.0, 'em': 0.5, 'f1': 0.75, 'n': 2}
    """
    if len(preds) != len(golds):
        raise DataError(f"{len(preds)} predictions but {len(golds)} gold answer lists")
    if not preds:
        raise DataError("no predictions to evaluate")
    n = len(preds)
    return {
        "accuracy": sum(contains_answer(p, g) for p, g in zip(preds, golds)) / n,
        "em": sum(exact_match(p, g) for p, g in zip(preds, golds)) / n,
        "f1": sum(token_f1(p, g) for p, g in zip(preds, golds)) / n,
        "n": n,
    }
