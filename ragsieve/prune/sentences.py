"""Sentence spans of a passage, from Wikimedia's ``sentencex`` (rule-based, ~300 languages, no model download).

Spans are ``(start, end)`` character offsets into the passage text with the surrounding white space
stripped, so ``text[start:end]`` is the sentence as written and kept spans can be shown to a user or
mapped back onto the source document.

Example::

    split_sentences("Hamlet is a tragedy. It is set in Denmark.")   # [(0, 20), (21, 42)]
"""

from __future__ import annotations

from functools import lru_cache

DEFAULT_LANGUAGE = "en"


@lru_cache(maxsize=4096)
def split_sentences(text: str, language: str = DEFAULT_LANGUAGE) -> tuple[tuple[int, int], ...]:
    """The sentences of ``text`` as stripped ``(start, end)`` spans, in order; none for blank text."""
    from sentencex import get_sentence_boundaries

    spans = []
    for b in get_sentence_boundaries(language, text):
        start, end = b["start_index"], b["end_index"]
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if end > start:
            spans.append((start, end))
    return tuple(spans)
