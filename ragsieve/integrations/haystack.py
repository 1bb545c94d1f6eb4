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

from ragsieve.integrations.stages import adapter_stages, keep


@component
class RagsieveRanker:
    """Ranks Haystack documents with a ragsieve ranker, service or sieve; ``Document.score`` becomes its score.

    With ``sieve`` (a fitted sieve folder, ``embedded:<name>`` or a ``Sieve``) the sieve's top_k and
    grader decide (``run(top_k=...)`` and ``threshold`` override them); ``top_k`` here is the bare ranker's cut.
    Scores and ``threshold`` are in [0, 1] for a service URL (``/v1/rerank``'s), raw in-process.
    """

    def __init__(
        self,
        ranker: Any = "embedded:base",
        top_k: Optional[int] = 3,
        threshold: Optional[float] = None,
        api_key: Optional[str] = None,
        sieve: Any = None,
        prune_threshold: Optional[float] = None,
    ):
        self.ranker_source, self.sieve = ranker, sieve
        self.top_k, self.threshold = top_k, threshold  # top_k: a bare ranker's cut (a sieve brings its own)
        self.api_key = api_key
        self.prune_threshold = prune_threshold  # cut kept documents to their sentences scoring >= this
        self._stages = None

    def warm_up(self) -> None:
        """Load the model (Haystack calls this before the first run)."""
        if self._stages is None:
            self._stages = adapter_stages(
                self.ranker_source, sieve=self.sieve, api_key=self.api_key,
                top_n=None if self.sieve is not None else self.top_k, threshold=self.threshold,
                prune_threshold=self.prune_threshold,
            )

    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document], top_k: Optional[int] = None) -> dict[str, list[Document]]:
        self.warm_up()
        kept = keep(self._stages.override(top_k=top_k), query, [d.content or "" for d in documents])
        return {"documents": [
            replace(documents[k.index], score=k.score) if k.text is None else
            replace(documents[k.index], score=k.score, content=k.text,
                    meta={**documents[k.index].meta, "kept_spans": k.kept_spans})
            for k in kept
        ]}
