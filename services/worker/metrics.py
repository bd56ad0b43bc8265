"""The worker's Prometheus metrics. Tenants are labelled: a tenant count is bounded by
the tenant policy file, unlike request ids or sessions, which never become labels."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from switchyard.metrics import LATENCY_BUCKETS

TTFT = Histogram(
    "sy_worker_ttft_seconds", "Engine start to first token", ["engine"], buckets=LATENCY_BUCKETS
)
TPOT = Histogram(
    "sy_worker_tpot_seconds", "Mean time per output token after the first", ["engine"],
    buckets=LATENCY_BUCKETS,
)  # fmt: skip
QUEUE = Histogram(
    "sy_worker_queue_seconds", "Admission (or creation) to engine start", ["engine"],
    buckets=LATENCY_BUCKETS,
)  # fmt: skip
TOKENS_IN = Counter("sy_worker_prompt_tokens_total", "Prompt tokens", ["tenant"])
TOKENS_OUT = Counter("sy_worker_completion_tokens_total", "Completion tokens", ["tenant"])
RESULTS = Counter("sy_worker_results_total", "Requests finished, by status", ["status"])
KV_USAGE = Gauge("sy_worker_kv_cache_usage", "KV-cache use, 0-1", ["engine"])
RUNNING = Gauge("sy_worker_running", "Requests running in the engine", ["engine"])
WAITING = Gauge("sy_worker_waiting", "Requests waiting for the engine", ["engine"])
PREFIX_HIT = Gauge("sy_worker_prefix_hit_ratio", "Prefix-cache hit tokens / queried", ["engine"])
PARTITIONS = Gauge("sy_worker_partitions", "Partitions this worker owns")
