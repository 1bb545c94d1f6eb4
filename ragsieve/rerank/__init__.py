"""Rerankers behind one contract (:class:`BaseRanker`); specs resolve in :mod:`ragsieve.registry`.

Modules: ``base`` (the contract, typed results), ``lexical`` (BM25), ``neural`` (bi- and
cross-encoders), ``fast`` (ONNX / int8 forwards), ``pointwise`` (a causal LM's verdict),
``embedded`` (ragsieve's own base cross-encoder), ``relevance`` (gold relevance data),
``train`` + ``losses`` (cross-encoder training).
"""

from ragsieve.rerank.base import BaseRanker, RankedResult, RankedResults, RetrievalOrder, as_passages

__all__ = ["BaseRanker", "RankedResult", "RankedResults", "RetrievalOrder", "as_passages"]
