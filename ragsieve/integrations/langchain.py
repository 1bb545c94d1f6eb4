"""LangChain: :class:`RagsieveCompressor`, a ``BaseDocumentCompressor`` (``pip install 'ragsieve[langchain]'``).

Use it in-process (a ranker or a reranker spec) or against ``ragsieve serve`` (a URL);
each kept document gets ``metadata["relevance_score"]``: in [0, 1] from a URL (``/v1/rerank``'s
score), the ranker's raw score in-process (``threshold`` is on the same scale; see
:mod:`ragsieve.integrations.stages`).

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

from ragsieve.integrations.stages import keep, pydantic_adapter_stages


class RagsieveCompressor(BaseDocumentCompressor):
    """Rerank and cut (and optionally threshold or grade) LangChain documents with a ragsieve ranker, service or sieve."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    ranker: Any = "embedded:base"  # BaseRanker, reranker spec, or http(s):// URL of `ragsieve serve`
    sieve: Any = None  # a fitted sieve (folder, embedded:<name> or Sieve): its reranker, top_k and grader
    top_n: Optional[int] = 3  # with a sieve: its top_k unless given
    # drop documents scoring below it: [0, 1] for a URL, raw in-process (with a sieve: overrides its grader's)
    threshold: Optional[float] = None
    api_key: Optional[str] = None
    # cut each kept document to its sentences the ranker scores >= this (the threshold's scale); a sieve's own
    prune_threshold: Optional[float] = None
    _stages: Any = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        self._stages = pydantic_adapter_stages(self)

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Optional[Callbacks] = None
    ) -> Sequence[Document]:
        kept = keep(self._stages, query, [d.page_content for d in documents])
        return [
            Document(
                page_content=documents[k.index].page_content if k.text is None else k.text,
                metadata={**documents[k.index].metadata, "relevance_score": k.score,
                          **({"kept_spans": k.kept_spans} if k.kept_spans is not None else {})},
                id=documents[k.index].id,
            )
            for k in kept
        ]
