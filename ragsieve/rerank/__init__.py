"""Rerankers behind one interface; :func:`load_reranker` imports only the one asked for."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ragsieve.errors import RagsieveError
from ragsieve.rerank.base import BaseRanker, RankedResult, RankedResults, as_passages

#: name → "module:Class"; a spec "name:arg" passes arg as the first constructor argument.
RERANKERS: dict[str, str] = {
    "bm25": "ragsieve.rerank.lexical:BM25Ranker",
    "bi-encoder": "ragsieve.rerank.neural:BiEncoderRanker",
    "cross-encoder": "ragsieve.rerank.neural:CrossEncoderRanker",
    "embedded": "ragsieve.rerank.embedded:load_embedded_reranker",
}


def load_reranker(spec: str, **kwargs: Any) -> BaseRanker:
    """``bm25``, ``bi-encoder[:<encoder spec>]``, ``cross-encoder:<folder or HF id>`` or ``embedded:base``.

    ``embedded:base`` is ragsieve's own cross-encoder, trained from MiniLM on first use;
    a bare folder path is read as ``cross-encoder:<folder>``.

    Example::

        load_reranker("cross-encoder:results/rerank/base").top_k(query, passages, 3)
    """
    if spec and ":" not in spec and Path(spec).is_dir():  # a bare folder = a cross-encoder
        spec = f"cross-encoder:{spec}"
    name, sep, arg = (spec or "").partition(":")
    try:
        module, _, cls = RERANKERS[name].partition(":")
    except KeyError:
        raise RagsieveError(f"unknown reranker '{name}'; known: {', '.join(sorted(RERANKERS))}") from None
    ranker_cls = getattr(importlib.import_module(module), cls)
    return ranker_cls(arg, **kwargs) if sep else ranker_cls(**kwargs)


__all__ = ["BaseRanker", "RERANKERS", "RankedResult", "RankedResults", "as_passages", "load_reranker"]
