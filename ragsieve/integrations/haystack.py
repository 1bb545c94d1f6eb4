"""Haystack: :class:`RagsieveRanker`, a ``@component`` ranker (``pip install 'ragsieve[haystack]'``).

Example::

    from haystack import Pipeline
    from ragsieve.integrations.haystack import RagsieveRanker

    pipe = Pipeline()
    pipe.add_component("retriever", retriever)
    pipe.add_component("ranker", RagsieveRanker(ranker="http://127.0.0.1:8080", top_k=3))  # or "embedded:base"
    pipe.connect("retriever.documents", "ranker.documents")
    pipe.run({"retriever": {"query": q}, "ranker": {"query": q}})
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Optional

# ragsieve makes no outbound call unless an endpoint is configured; Haystack's telemetry
# (PostHog) would, on the first pipeline run. A user who wants it sets the variable to true.
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack import Document, component  # noqa: E402

from ragsieve.integrations.remote import resolve_ranker, select


@component
class RagsieveRanker:
    """Ranks Haystack documents with a ragsieve ranker or service; ``Document.score`` becomes its score."""

    def __init__(
        self,
        ranker: Any = "embedded:base",
        top_k: Optional[int] = 3,
        threshold: Optional[float] = None,
        api_key: Optional[str] = None,
    ):
        self.ranker_source = ranker
        self.top_k = top_k
        self.threshold = threshold
        self.api_key = api_key
        self._ranker = None

    def warm_up(self) -> None:
        """Load the model (Haystack calls this before the first run)."""
        if self._ranker is None:
            self._ranker = resolve_ranker(self.ranker_source, self.api_key)

    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document], top_k: Optional[int] = None) -> dict[str, list[Document]]:
        self.warm_up()
        kept = select(self._ranker, query, [d.content or "" for d in documents], top_k or self.top_k, self.threshold)
        return {"documents": [replace(documents[i], score=s) for i, s in kept]}
