"""The service's Prometheus metrics, in their own registry.

Does not: serve them (the app's ``/metrics`` route does).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..qa.answer import Answer


class Metrics:
    """TTFT and request-time histograms, prefill and decode rates, the
    cached-token ratio, the queue depth, and requests by outcome."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        buckets = (0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 8, 13, 21, 34, 60)
        self.ttft = Histogram("rag_ttft_seconds", "Time to first token, retrieval and queue included", buckets=buckets, registry=r)
        self.total = Histogram("rag_request_seconds", "Whole request time", buckets=buckets, registry=r)
        self.prefill_rate = Histogram("rag_prefill_tokens_per_second", "Prompt tokens evaluated per second",
                                      buckets=(25, 50, 100, 200, 400, 800, 1600, 3200, 6400, 12800), registry=r)
        self.decode_rate = Histogram("rag_decode_tokens_per_second", "Answer tokens per second",
                                     buckets=(10, 25, 50, 100, 200, 400, 800, 1600), registry=r)
        self.cached_ratio = Histogram("rag_cached_token_ratio", "Share of prompt tokens found in the KV cache",
                                      buckets=(0.1, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 1.0), registry=r)
        self.queue_depth = Gauge("rag_queue_depth", "Requests waiting for or using the engine", registry=r)
        self.requests = Counter("rag_requests", "Requests by endpoint and outcome", ["endpoint", "outcome"], registry=r)
        self.over_target = Counter("rag_requests_over_target", "Requests whose TTFT exceeded their target", registry=r)

    def observe(self, answer: Answer) -> None:
        """Record one answered request."""
        t = answer.timings
        self.ttft.observe(t.ttft_s)
        self.total.observe(t.total_s)
        if t.prefill_s > 0 and t.prefill_tokens > 1:
            self.prefill_rate.observe(t.prefill_tokens / t.prefill_s)
        if t.decode_s > 0 and t.decode_tokens > 1:
            self.decode_rate.observe(t.decode_tokens / t.decode_s)
        if t.prompt_tokens:
            self.cached_ratio.observe(t.cached_tokens / t.prompt_tokens)
        target = answer.budget.target_ttft
        if target is not None and t.ttft_s > target:
            self.over_target.inc()
