"""``ragsieve serve``: a rerank / filter HTTP service that RAG clients already speak.

Cohere/Jina ``/v1/rerank`` ``/v2/rerank``, TEI ``/rerank``, ragsieve's ``/v1/filter``;
with an LLM ``/v1/gate`` and ``/v1/ask``; with an evolve store ``/v1/feedback``;
``/health``, ``/v1/models``, ``/admin/reload``. Dynamic batching on a worker thread;
limits answered 413/422 with the field named; API key on everything but ``/health``.

Example::

    from ragsieve.serve import ServeConfig, create_app
    app = create_app(ServeConfig(reranker="bm25"))   # any ASGI server; `ragsieve serve` uses uvicorn
"""

from ragsieve.serve.app import create_app
from ragsieve.serve.config import ServeConfig

__all__ = ["ServeConfig", "create_app"]
