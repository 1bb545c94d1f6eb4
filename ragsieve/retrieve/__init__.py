"""First-stage retrieval: BM25, dense (bi-encoder + faiss) and hybrid (RRF), plus on-disk indexes
and a dense index in PostgreSQL (pgvector), named by a ``postgresql://`` URL instead of a folder.

Heavy dependencies (torch, sentence-transformers, faiss, bm25s) load only when an index is
built, loaded or searched, so importing this package is cheap.

Example::

    from ragsieve.retrieve import build_index, load_index

    retriever = build_index(passages, "indexes/demo", kind="hybrid", show_progress=False)
    hits = load_index("indexes/demo").search("who discovered penicillin", k=5)
"""

from __future__ import annotations

from ragsieve.retrieve.base import Hit, Retriever
from ragsieve.retrieve.bm25 import BM25Retriever
from ragsieve.retrieve.dense import DenseRetriever
from ragsieve.retrieve.hybrid import HybridRetriever
from ragsieve.retrieve.corpus import ChunkConfig, read_corpus
from ragsieve.retrieve.index import add_to_index, build_index, load_index
from ragsieve.retrieve.pgvector import PgVectorRetriever

__all__ = [
    "BM25Retriever", "ChunkConfig", "DenseRetriever", "Hit", "HybridRetriever", "PgVectorRetriever", "Retriever",
    "add_to_index", "build_index", "load_index", "read_corpus",
]
