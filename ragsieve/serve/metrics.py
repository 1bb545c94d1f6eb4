"""``/metrics``: what an operator watches, in Prometheus text format (``prometheus-client``).

One :class:`ServeMetrics` per served app, on its own registry (several apps in one process,
as in tests, never mix their counts). Request counts and latency are taken by the Guard
middleware; queue, batch and pair figures by the batchers; feedback and traffic rows by the
routes and the traffic log. On Ray Serve each replica has its own and labels it (``replica``).

Example::

    metrics = ServeMetrics(model="embedded:base")
    metrics.pairs_scored.labels(model="ranker").inc(8)
    text = metrics.exposition()           # what GET /metrics answers
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: seconds: a 1-document request takes milliseconds, a 2 MB one a minute
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
PAIR_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class _TrafficRows:
    """``ragsieve_traffic_rows_total``: read from the traffic log's own counts at scrape time."""

    def __init__(self, counts: Callable[[], tuple[int, int] | None]):
        self.counts = counts

    def collect(self):
        family = CounterMetricFamily("ragsieve_traffic_rows", "served (query, document) rows for the evolve store "
                                     "(--log-traffic): written, or dropped on a full queue (requests)",
                                     labels=["outcome"])
        counts = self.counts()
        if counts is not None:
            family.add_metric(["written"], counts[0])
            family.add_metric(["dropped"], counts[1])
        yield family


class _EmbeddingCache:
    """The reranker's passage-vector cache (``--embedding-cache-mb``), read from its own counts at scrape time."""

    def __init__(self, stats: Callable[[], dict | None]):
        self.stats = stats

    def collect(self):
        stats = self.stats()
        lookups = CounterMetricFamily("ragsieve_embedding_cache_lookups", "passage vectors looked up in the cache "
                                      "(a miss is encoded and cached)", labels=["outcome"])
        stored = CounterMetricFamily("ragsieve_stored_vectors", "passage vectors an index supplied (not encoded)")
        size = GaugeMetricFamily("ragsieve_embedding_cache_bytes", "bytes of passage vectors held")
        if stats is not None:
            lookups.add_metric(["hit"], stats["hits"])
            lookups.add_metric(["miss"], stats["misses"])
            stored.add_metric([], stats["stored"])
            size.add_metric([], stats["bytes"])
        yield from (lookups, stored, size)


class ServeMetrics:
    """The service's counters, gauges and histograms on one registry; :meth:`exposition` renders them."""

    def __init__(self, model: str, replica: str | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        reg = {"registry": self.registry}
        self.requests = Counter("ragsieve_requests", "HTTP requests answered, by route and status",
                                ["route", "status"], **reg)
        self.latency = Histogram("ragsieve_request_seconds", "time to answer a request, by route", ["route"],
                                 buckets=LATENCY_BUCKETS, **reg)
        self.queue_requests = Gauge("ragsieve_queue_requests", "requests waiting for, or part-way through, "
                                    "scoring", ["model"], **reg)
        self.queue_pairs = Gauge("ragsieve_queue_pairs", "pairs waiting to be scored", ["model"], **reg)
        self.queue_wait = Histogram("ragsieve_queue_wait_seconds", "from a request's pairs being queued to its "
                                    "first slice being scored", ["model"], buckets=LATENCY_BUCKETS, **reg)
        self.batch_pairs = Histogram("ragsieve_batch_pairs", "pairs per model call", ["model"],
                                     buckets=PAIR_BUCKETS, **reg)
        self.pairs_scored = Counter("ragsieve_pairs_scored", "(query, text) pairs scored", ["model"], **reg)
        self.chunked_documents = Counter("ragsieve_chunked_documents", "documents longer than the model window, "
                                         "scored by their best chunk", **reg)
        self.truncated_documents = Counter("ragsieve_truncated_documents", "documents past max_chunks_per_doc "
                                           "windows: their tail was not scored", **reg)
        self.reloads = Counter("ragsieve_model_reloads", "model reloads (/admin/reload)", **reg)
        self.model = Info("ragsieve_model", "the served model and its version (1 at start, +1 per reload)", **reg)
        self.feedback_rows = Counter("ragsieve_feedback_rows", "/v1/feedback rows: written to the store, or "
                                     "dropped (the store failed; the client got a 503)", ["outcome"], **reg)
        self.traffic_counts: Callable[[], tuple[int, int] | None] = lambda: None
        self.registry.register(_TrafficRows(lambda: self.traffic_counts()))
        self.embedding_cache: Callable[[], dict | None] = lambda: None
        self.registry.register(_EmbeddingCache(lambda: self.embedding_cache()))
        self.replica = replica
        self.version = 0
        self.served(model)

    def served(self, model: str) -> None:
        """The models were (re)loaded: a new version of ``model`` is served."""
        self.version += 1
        self.model_name = model
        self._show_model()

    def on_replica(self, replica: str) -> None:
        """On Ray Serve: these are ``replica``'s figures (each replica has its own)."""
        self.replica = replica
        self._show_model()

    def _show_model(self) -> None:
        self.model.info({"model": self.model_name, "version": str(self.version),
                         **({"replica": self.replica} if self.replica else {})})

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
