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
# A request as its HTTP client felt it, on this process's clock from the request's
# arrival: to its first token (the whole answer, when not streamed) and to its answer's
# end, per pool (the answer names it) and workload; answers (status ok) only. Its phases
# here: `edge` (arrival -> the fleet stored it: parsing, keys, idempotency, publish) and
# `fleet` (-> the answer's end read back); sy_worker_phase_seconds splits the fleet's.
TTFT = Histogram(
    "sy_edge_time_to_first_token_seconds",
    "HTTP arrival to the first token read back (the answer, when not streamed)",
    ["pool", "workload"], buckets=LATENCY_BUCKETS,
)  # fmt: skip
DURATION = Histogram(
    "sy_edge_answer_duration_seconds", "HTTP arrival to the answer's end read back",
    ["pool", "workload"], buckets=LATENCY_BUCKETS,
)  # fmt: skip
PHASES = Histogram(
    "sy_edge_phase_seconds", "An answer's time at the edge (edge) and on the fleet (fleet)",
    ["pool", "phase"], buckets=LATENCY_BUCKETS,
)  # fmt: skip
INFLIGHT = Gauge("sy_edge_requests_in_flight", "HTTP requests being served")
CANCELS = Counter("sy_edge_cancels_total", "Cancels published, by reason", ["reason"])
TOKENS = Counter(
    "sy_edge_completion_tokens_total", "Completion tokens returned to clients", ["tenant"]
)

TENANTS = TenantLabel(20, watched=[TOKENS])


def completion_tokens(tenant: str, n: int) -> None:
    TOKENS.labels(TENANTS(tenant)).inc(n)
