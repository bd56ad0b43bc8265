"""Executor metrics. Tenants and rule ids are bounded sets (policy files, rules module)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from switchyard.metrics import LATENCY_BUCKETS

DECISIONS = Counter(
    "sy_sql_execute_total", "Execute/explain decisions", ["event", "verdict", "rule"]
)
DURATION = Histogram("sy_sql_execute_seconds", "Time to decide and run one request", ["event"],
                     buckets=LATENCY_BUCKETS)  # fmt: skip
KILLS = Counter("sy_sql_killed_total", "Statements stopped by a limit", ["reason"])
INFLIGHT = Gauge("sy_sql_execute_inflight", "Requests being handled")
AUDIT_FAILURES = Counter("sy_sql_execute_audit_failures_total", "Audit events not stored")
