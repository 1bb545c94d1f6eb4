"""LangChain: :class:`RagsieveCompressor`, a ``BaseDocumentCompressor`` (``pip install 'ragsieve[langchain]'``).

Use it in-process (a ranker or a reranker spec) or against ``ragsieve serve`` (a URL);
each kept document gets ``metadata["relevance_score"]``.

Example::

    from langchain_core.documents import Document
    from ragsieve.integrations.langchain import RagsieveCompressor

    compressor = RagsieveCompressor(ranker="http://127.0.0.1:8080", top_n=3)   # or ranker="embedded:base"
    compressor.compress_documents([Document(page_content="Shakespeare wrote Hamlet")], "who wrote hamlet")
    # any LangChain code that takes a BaseDocumentCompressor can use it
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from langchain_core.callbacks import Callbacks
from langchain_core.documents import Document
from langchain_core.documents.compressor import BaseDocumentCompressor
from pydantic import ConfigDict, PrivateAttr

from ragsieve.integrations.remote import resolve_ranker, select


class RagsieveCompressor(BaseDocumentCompressor):
    """Rerank (and optionally threshold) LangChain documents with a ragsieve ranker or service."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    ranker: Any = "embedded:base"  # BaseRanker, reranker spec, or http(s):// URL of `ragsieve serve`
    top_n: Optional[int] = 3
    threshold: Optional[float] = None  # drop documents scoring below it
    api_key: Optional[str] = None
    _ranker: Any = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        self._ranker = resolve_ranker(self.ranker, self.api_key)

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Optional[Callbacks] = None
    ) -> Sequence[Document]:
        kept = select(self._ranker, query, [d.page_content for d in documents], self.top_n, self.threshold)
        return [
            Document(
                page_content=documents[i].page_content,
                metadata={**documents[i].metadata, "relevance_score": s},
                id=documents[i].id,
            )
            for i, s in kept
        ]
