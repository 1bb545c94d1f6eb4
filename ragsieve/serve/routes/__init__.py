"""The endpoint families, one :class:`~fastapi.APIRouter` each, sharing :class:`~ragsieve.serve.state.ServeState`.

- :mod:`.rerank`: ``/v1/rerank``, ``/v2/rerank``, ``/rerank`` (Cohere/Jina/TEI shapes)
- :mod:`.filter`: ``/v1/filter`` (the sieve)
- :mod:`.rag`: ``/v1/gate``, ``/v1/ask`` (with an LLM)
- :mod:`.feedback`: ``/v1/feedback`` (with an evolve store)
- :mod:`.admin`: ``/health``, ``/v1/models``, ``/admin/reload``
"""
