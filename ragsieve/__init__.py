"""ragsieve: LLM-aware post-retrieval filtering for RAG.

Pipeline: gate (CBDR) → retrieve → rerank → grade → generate. Each stage lives in its
own subpackage (``data``, ``retrieve``, ``probe``, ``gate``, ``pipeline``, ``eval``);
heavy libraries load only when a model does, so ``import ragsieve`` is cheap.
"""

__version__ = "0.1.0"
