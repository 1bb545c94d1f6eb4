"""A ``ragsieve serve`` (or any Cohere-compatible rerank endpoint) as an ordinary ranker.

The adapters accept a ranker, a reranker spec or a URL; :func:`resolve_ranker` turns each
into a :class:`~ragsieve.rerank.base.BaseRanker`, so in-process and remote use share one
code path.

Example::

    ranker = resolve_ranker("http://127.0.0.1:8080", api_key="k")   # or "bm25", or a BaseRanker
    ranker.rank("who wrote hamlet", ["Paris", "Shakespeare wrote Hamlet"]).top_k(1)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.rerank.base import BaseRanker, as_passages

if TYPE_CHECKING:
    from ragsieve.pipeline.stages import SieveStages


class RemoteRanker(BaseRanker):
    """Scores via ``POST {url}/v1/rerank`` (Cohere/Jina shape); ``api_key`` defaults to $RAGSIEVE_API_KEY."""

    name = "remote"

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 60.0, model: str = "ragsieve"):
        import httpx

        self.url = url.rstrip("/")
        self.model = model
        key = api_key if api_key is not None else os.environ.get("RAGSIEVE_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def score(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        texts = [p.full_text for p in as_passages(passages)]
        if not texts:
            return np.zeros(0, dtype=float)
        response = self._client.post("/v1/rerank", json={"model": self.model, "query": query, "documents": texts})
        if response.status_code != 200:
            try:
                detail = response.json().get("error", response.text)
            except ValueError:
                detail = response.text
            raise RagsieveError(f"{self.url}/v1/rerank answered {response.status_code}: {str(detail)[:200]}")
        scores = np.zeros(len(texts), dtype=float)
        for item in response.json()["results"]:
            scores[item["index"]] = item["relevance_score"]
        return scores

    def close(self) -> None:
        self._client.close()


def resolve_ranker(ranker: Any, api_key: str | None = None) -> BaseRanker:
    """A BaseRanker from a ranker, an ``http(s)://`` service URL or a reranker spec string."""
    if isinstance(ranker, BaseRanker):
        return ranker
    if isinstance(ranker, str) and ranker.startswith(("http://", "https://")):
        return RemoteRanker(ranker, api_key=api_key)
    if isinstance(ranker, str):
        from ragsieve.registry import load_reranker

        return load_reranker(ranker)
    raise RagsieveError(f"expected a ranker, a reranker spec or a service URL, got {type(ranker).__name__}")


def adapter_stages(
    ranker: Any = None, *, sieve: Any = None, top_n: int | None = None, threshold: float | None = None,
    api_key: str | None = None,
) -> "SieveStages":
    """The one sieve an adapter applies.

    With ``sieve`` (a fitted sieve folder, ``embedded:<name>`` or a loaded :class:`Sieve`), its
    reranker, top_k and grader; ``top_n`` / ``threshold``, when given, override its cut and threshold.
    Otherwise ``ranker`` (see :func:`resolve_ranker`) cut to ``top_n`` (None: no cut), thresholded on
    its own scores when ``threshold`` is given.
    """
    from ragsieve.pipeline.stages import SieveStages

    if sieve is not None:
        from ragsieve.pipeline.sieve import Sieve

        loaded = sieve if isinstance(sieve, Sieve) else Sieve.load(sieve)
        return loaded.stages.override(top_k=top_n, threshold=threshold)
    return SieveStages(resolve_ranker(ranker, api_key), top_k=top_n, threshold=threshold)


def pydantic_adapter_stages(adapter: Any) -> "SieveStages":
    """:func:`adapter_stages` for a pydantic adapter (fields ``ranker``, ``sieve``, ``top_n``, ``threshold``,
    ``api_key``): with a sieve, only the fields the user set override it."""
    given = adapter.model_fields_set if adapter.sieve is not None else {"top_n", "threshold"}
    return adapter_stages(
        adapter.ranker, sieve=adapter.sieve, api_key=adapter.api_key,
        top_n=adapter.top_n if "top_n" in given else None,
        threshold=adapter.threshold if "threshold" in given else None,
    )


def keep(stages: "SieveStages", query: str, texts: Sequence[str]) -> list[tuple[int, float]]:
    """(index, reranker score) of the documents the sieve keeps, best first."""
    if not texts:
        return []
    return [(r.index, r.score) for r, _ in stages.apply(query, list(texts)).kept_results]
