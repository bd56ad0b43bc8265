"""Executor metrics. Rule ids and kill reasons are bounded sets (rules module, limits)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from switchyard.metrics import LATENCY_BUCKETS
from switchyard.sqldb.runner import KILL_REASONS

DECISIONS = Counter(
    "sy_sql_executions_total",
    "Execute decisions, by event, verdict and rule",
    ["event", "verdict", "rule"],
)
DURATION = Histogram(
    "sy_sql_execute_duration_seconds", "Time to decide and run one request", ["event"],
    buckets=LATENCY_BUCKETS,
)  # fmt: skip
KILLS = Counter(
    "sy_sql_killed_statements_total", "Statements stopped by a limit (timeout, watchdog KILL)",
    ["reason"],
)  # fmt: skip
# At 0 from the start, so the kill alert and panel read a series (not "no data") on a
# fleet that never killed one.
for _reason in KILL_REASONS:
    KILLS.labels(_reason)
INFLIGHT = Gauge("sy_sql_execute_requests_in_flight", "Execute requests being handled")
AUDIT_FAILURES = Counter(
    "sy_sql_execute_audit_failures_total", "Executor audit events that could not be published"
)
