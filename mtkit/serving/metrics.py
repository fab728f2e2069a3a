"""What `mtkit serve` tells a monitoring system: GET /metrics in the Prometheus text format,
through `prometheus-client` (`pip install 'mtkit[metrics]'`).

Each app has its own `CollectorRegistry` (not the library's global one), so that many apps
in one process (tests) do not clash. No label holds a client's text or a secret: requests
are labelled by their route's template (`/v1/translate`, not the path asked; any path no
route takes is "other") and their status class ("2xx" ... "5xx"), so that the label values
are few whatever clients send.

    mtkit_requests_total{route, status}     requests answered
    mtkit_request_seconds{route}            latency histogram, from arrival to answer
    mtkit_batches_total                     searches begun (a round's, or a join to the stream)
    mtkit_batch_sentences, _batch_tokens    sentences and source tokens per batch (histograms)
    mtkit_queue_sentences                   sentences waiting, read at scrape time
    mtkit_translated_sentences_total        sentences translated
    mtkit_translated_tokens_total           target tokens produced: tokens/s is rate() of it
    mtkit_model_load_seconds                how long the model took to load
    mtkit_warmup_seconds                    how long the warm-up search took
    mtkit_ready                             1 while /v1/ready answers 200
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.routing import Match

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
except ImportError:  # the server runs without it; /metrics says what to install
    CollectorRegistry = None

NOT_INSTALLED = "metrics need prometheus-client: pip install 'mtkit[metrics]'"
OTHER_ROUTE = "other"  # the label of every path that no route takes (404s)
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SENTENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)


class Metrics:
    """One app's registry and collectors. `queue_sentences` and `ready` are read at scrape
    time; the batcher calls `batch_ran` and `translated`; `Recorded` counts requests."""

    def __init__(self, queue_sentences: Callable[[], int], ready: Callable[[], bool]):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "mtkit_requests",
            "Requests answered, by route and status class",
            ["route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "mtkit_request_seconds", "Time from a request's arrival to its answer, by route",
            ["route"], buckets=LATENCY_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.batches = Counter("mtkit_batches", "Searches run by the model worker", registry=r)
        self.batch_sentences = Histogram(
            "mtkit_batch_sentences", "Sentences per batch", buckets=SENTENCE_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "mtkit_batch_tokens", "Source tokens per batch", buckets=TOKEN_BUCKETS, registry=r
        )
        self.sentences = Counter("mtkit_translated_sentences", "Sentences translated", registry=r)
        self.tokens = Counter(
            "mtkit_translated_tokens", "Target tokens produced (rate() of it: tokens/s)",
            registry=r,
        )  # fmt: skip
        Gauge(
            "mtkit_queue_sentences", "Sentences accepted and waiting for the model", registry=r
        ).set_function(queue_sentences)
        Gauge("mtkit_ready", "1 while /v1/ready answers 200", registry=r).set_function(
            lambda: float(ready())
        )
        self.load_seconds = Gauge(
            "mtkit_model_load_seconds", "Seconds the model took to load", registry=r
        )
        self.warmup_seconds = Gauge(
            "mtkit_warmup_seconds", "Seconds the warm-up search took", registry=r
        )

    def batch_ran(self, sentences: int, tokens: int) -> None:
        """A search began with `sentences` sentences of `tokens` source tokens."""
        self.batches.inc()
        self.batch_sentences.observe(sentences)
        self.batch_tokens.observe(tokens)

    def translated(self, sentences: int, tokens: int) -> None:
        """`sentences` were answered with `tokens` target tokens in all."""
        self.sentences.inc(sentences)
        self.tokens.inc(tokens)

    def scrape(self) -> tuple[bytes, str]:
        """The text a scraper reads, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def open_metrics(queue_sentences: Callable[[], int], ready: Callable[[], bool]) -> Metrics | None:
    """The app's metrics, or None where prometheus-client is not installed."""
    if CollectorRegistry is None:
        return None
    return Metrics(queue_sentences, ready)


class Recorded:
    """ASGI middleware, outermost: every answered request counted under its route's
    template (set in the scope by the router; `OTHER_ROUTE` where none took it) and its
    status class, and its latency observed."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500  # what the server answers when the app fails before it starts one

        async def noted(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noted)
        finally:
            self._count(scope, status, time.perf_counter() - start)

    def _count(self, scope, status: int, seconds: float) -> None:
        route = scope.get("route")  # set by the router; not for a request refused before it
        if route is None:
            app = scope.get("app")
            routes = app.router.routes if app is not None else ()
            route = next((r for r in routes if r.matches(scope)[0] != Match.NONE), None)
        label = getattr(route, "path", OTHER_ROUTE)
        self.metrics.requests.labels(label, f"{status // 100}xx").inc()
        self.metrics.latency.labels(label).observe(seconds)
