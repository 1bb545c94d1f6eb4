"""Rerankers behind one contract (:class:`BaseRanker`); specs resolve in :mod:`ragsieve.registry`.

This package is inference: ``base`` (the contract, typed results), ``lexical`` (BM25), ``neural``
(bi- and cross-encoders), ``fast`` (ONNX / int8 forwards), ``mixed`` (logit + cosine),
``calibration``, ``pointwise`` (a causal LM's verdict), ``shipped`` (``embedded:base``, the
cross-encoder shipped in the package), ``remote`` (``http(s)://`` services), ``evolving``
(``evolve:<store>``). Training lives in :mod:`ragsieve.rerank.training`; the benchmark data the
base reranker was built from in :mod:`ragsieve.benchmarks`.
"""

from ragsieve.rerank.base import BaseRanker, RankedResult, RankedResults, RetrievalOrder, as_passages

__all__ = ["BaseRanker", "RankedResult", "RankedResults", "RetrievalOrder", "as_passages"]
