"""``http(s)://``: a ``ragsieve serve`` (or any Cohere-compatible rerank endpoint) as an ordinary ranker.

Example::

    ranker = load_reranker("http://127.0.0.1:8080", api_key="k")   # ragsieve.registry
    ranker.rank("who wrote hamlet", ["Paris", "Shakespeare wrote Hamlet"]).top_k(1)
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.rerank.base import BaseRanker, as_passages


class RemoteRanker(BaseRanker):
    """Scores via ``POST {url}/v1/rerank`` (Cohere/Jina shape); ``api_key`` defaults to $RAGSIEVE_API_KEY."""

    name = "remote"
    #: Cohere-compatible services (``ragsieve serve`` included) answer relevance scores in [0, 1]
    score_is_probability = True

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
