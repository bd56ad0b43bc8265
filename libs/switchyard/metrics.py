"""Prometheus metrics: one `/metrics` server per process and the buckets we share."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

# Latency buckets from 1 ms to 60 s: agent steps live around 0.1-0.5 s, SQL runs to tens of s.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
    0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


def serve_metrics(port: int, registry: CollectorRegistry = REGISTRY) -> int:
    """Start the `/metrics` HTTP server; port 0 disables it. Returns the port."""
    if port:
        start_http_server(port, registry=registry)
    return port
