"""The edge's Prometheus metrics (module-level: one registry per process)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from switchyard.metrics import LATENCY_BUCKETS, TenantLabel

REQUESTS = Counter(
    "sy_edge_requests_total", "HTTP requests, by route and status", ["route", "status"]
)
LATENCY = Histogram(
    "sy_edge_request_duration_seconds", "HTTP request time to response start", ["route"],
    buckets=LATENCY_BUCKETS,
)  # fmt: skip
INFLIGHT = Gauge("sy_edge_requests_in_flight", "HTTP requests being served")
CANCELS = Counter("sy_edge_cancels_total", "Cancels published, by reason", ["reason"])
TOKENS = Counter(
    "sy_edge_completion_tokens_total", "Completion tokens returned to clients", ["tenant"]
)

TENANTS = TenantLabel(20, watched=[TOKENS])


def completion_tokens(tenant: str, n: int) -> None:
    TOKENS.labels(TENANTS(tenant)).inc(n)
