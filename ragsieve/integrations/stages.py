"""What the framework adapters share: the ranker (in-process, a spec or a ``ragsieve serve`` URL) or fitted
sieve they apply, as one :class:`~ragsieve.pipeline.stages.SieveStages`.

Specs and URLs resolve in :func:`ragsieve.registry.load_reranker` (a URL is a
:class:`~ragsieve.rerank.remote.RemoteRanker`), so in-process and remote use share one code path.

**Scale.** Scores and ``threshold`` are on the scale of what the ranker answers: for a service URL
the [0, 1] ``relevance_score`` of ``/v1/rerank``; in-process (a ranker, a spec, a sieve) the raw
score, as :meth:`~ragsieve.rerank.base.BaseRanker.score` and ``Sieve.filter`` give it (the logit for
``embedded:base``; a sieve's threshold as its ``sieve.json`` stores it). In-process, pass
``threshold=ranker.raw_threshold(t)`` to keep what ``threshold=t`` keeps over HTTP.

Example::

    stages = adapter_stages("http://127.0.0.1:8080", top_n=3, api_key="k")   # or "bm25", or sieve="sieves/mine"
    keep(stages, "who wrote hamlet", ["Paris", "Shakespeare wrote Hamlet"])    # [(1, score)]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from ragsieve.errors import RagsieveError
from ragsieve.rerank.base import BaseRanker

if TYPE_CHECKING:
    from ragsieve.pipeline.stages import SieveStages


def adapter_stages(
    ranker: Any = None, *, sieve: Any = None, top_n: int | None = None, threshold: float | None = None,
    api_key: str | None = None, prune_threshold: float | None = None,
) -> "SieveStages":
    """The one sieve an adapter applies.

    With ``sieve`` (a fitted sieve folder, ``embedded:<name>`` or a loaded :class:`Sieve`), its
    reranker, top_k and grader; ``top_n`` / ``threshold``, when given, override its cut and (raw) threshold.
    Otherwise ``ranker`` (a ranker, a reranker spec, or a service URL whose key is ``api_key``) cut to
    ``top_n`` (None: no cut), thresholded on its own scores when ``threshold`` is given (raw in-process,
    [0, 1] for a URL: see the module doc). ``prune_threshold`` (the same scale) cuts each kept document to its
    sentences scoring at least that with the ranker (a sieve that prunes brings its own).
    """
    from ragsieve.pipeline.stages import SieveStages
    from ragsieve.registry import is_url, load_reranker

    if sieve is not None:
        from ragsieve.pipeline.sieve import Sieve

        loaded = sieve if isinstance(sieve, Sieve) else Sieve.load(sieve)
        stages = loaded.stages.override(top_k=top_n, threshold=threshold)
        if prune_threshold is not None and stages.pruner is None:
            from ragsieve.prune import SentencePruner

            stages = stages.override(pruner=SentencePruner(loaded.reranker))
        return stages.override(prune_threshold=prune_threshold)
    if not isinstance(ranker, (BaseRanker, str)):
        raise RagsieveError(f"expected a ranker, a reranker spec or a service URL, got {type(ranker).__name__}")
    options = {"api_key": api_key} if is_url(ranker) else {}
    loaded = load_reranker(ranker, **options)
    pruner = None
    if prune_threshold is not None:
        from ragsieve.prune import SentencePruner

        pruner = SentencePruner(loaded, threshold=prune_threshold)
    return SieveStages(loaded, top_k=top_n, threshold=threshold, pruner=pruner)


def pydantic_adapter_stages(adapter: Any) -> "SieveStages":
    """:func:`adapter_stages` for a pydantic adapter (fields ``ranker``, ``sieve``, ``top_n``, ``threshold``,
    ``api_key``): with a sieve, only the fields the user set override it."""
    given = adapter.model_fields_set if adapter.sieve is not None else {"top_n", "threshold"}
    return adapter_stages(
        adapter.ranker, sieve=adapter.sieve, api_key=adapter.api_key,
        top_n=adapter.top_n if "top_n" in given else None,
        threshold=adapter.threshold if "threshold" in given else None,
        prune_threshold=adapter.prune_threshold,
    )


class Kept(NamedTuple):
    """A document the sieve keeps: its input index, the reranker's score (its own scale) and, when the sieve
    pruned it, the kept text and its character spans in the input (None: kept whole)."""

    index: int
    score: float
    text: str | None = None
    kept_spans: list[tuple[int, int]] | None = None


def keep(stages: "SieveStages", query: str, texts: Sequence[str]) -> list[Kept]:
    """The documents the sieve keeps, best first."""
    if not texts:
        return []
    result = stages.apply(query, list(texts))
    return [Kept(r.index, r.score, p.text if p is not None else None, p.kept_spans if p is not None else None)
            for r, _, p in result.kept_items]
