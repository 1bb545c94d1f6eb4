"""LlamaIndex: :class:`RagsieveRerank`, a ``BaseNodePostprocessor`` (``pip install 'ragsieve[llama-index]'``).

Example::

    from ragsieve.integrations.llama_index import RagsieveRerank

    rerank = RagsieveRerank(ranker="http://127.0.0.1:8080", top_n=3)        # or ranker="embedded:base"
    index.as_query_engine(similarity_top_k=20, node_postprocessors=[rerank])
    rerank.postprocess_nodes(nodes, query_str="who wrote hamlet")
"""

from __future__ import annotations

from typing import Any, List, Optional

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from ragsieve.errors import RagsieveError
from ragsieve.integrations.stages import keep, pydantic_adapter_stages


class RagsieveRerank(BaseNodePostprocessor):
    """Rerank (and optionally threshold) nodes with a ragsieve ranker or service; node scores become its scores:
    in [0, 1] from a service URL (``/v1/rerank``'s), raw in-process; ``threshold`` is on the same scale."""

    ranker: Any = Field(default="embedded:base", description="BaseRanker, reranker spec, or ragsieve serve URL")
    sieve: Any = Field(default=None, description="a fitted sieve (folder, embedded:<name> or Sieve)")
    top_n: Optional[int] = 3  # with a sieve: its top_k unless given
    threshold: Optional[float] = None  # [0, 1] for a URL, raw in-process; with a sieve: overrides its grader's
    api_key: Optional[str] = None
    # cut each kept node to its sentences the ranker scores >= this (the threshold's scale); a sieve's own
    prune_threshold: Optional[float] = None
    _stages: Any = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        self._stages = pydantic_adapter_stages(self)

    @classmethod
    def class_name(cls) -> str:
        return "RagsieveRerank"

    def _postprocess_nodes(
        self, nodes: List[NodeWithScore], query_bundle: Optional[QueryBundle] = None
    ) -> List[NodeWithScore]:
        if query_bundle is None:
            raise RagsieveError("RagsieveRerank needs the query (query_bundle or query_str)")
        texts = [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]
        kept = keep(self._stages, query_bundle.query_str, texts)
        return [NodeWithScore(node=nodes[k.index].node if k.text is None else _with_text(nodes[k.index].node, k),
                              score=k.score) for k in kept]


def _with_text(node: Any, kept: Any) -> Any:
    """A copy of ``node`` holding only the sentences pruning kept (``metadata["kept_spans"]`` says which)."""
    copy = node.model_copy(deep=True)
    copy.set_content(kept.text)
    copy.metadata = {**copy.metadata, "kept_spans": kept.kept_spans}
    copy.excluded_embed_metadata_keys = [*copy.excluded_embed_metadata_keys, "kept_spans"]
    copy.excluded_llm_metadata_keys = [*copy.excluded_llm_metadata_keys, "kept_spans"]
    return copy
