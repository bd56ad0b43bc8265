"""The edge's Prometheus metrics (module-level: one registry per process)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from switchyard.metrics import LATENCY_BUCKETS

REQUESTS = Counter(
    "sy_edge_requests_total", "HTTP requests, by route and status", ["route", "status"]
)
LATENCY = Histogram(
    "sy_edge_request_seconds", "HTTP request time to response start", ["route"],
    buckets=LATENCY_BUCKETS,
)  # fmt: skip
INFLIGHT = Gauge("sy_edge_inflight", "HTTP requests being served")
CANCELS = Counter("sy_edge_cancels_total", "Cancels published, by reason", ["reason"])
TOKENS = Counter("sy_edge_completion_tokens_total", "Completion tokens returned", ["tenant"])
