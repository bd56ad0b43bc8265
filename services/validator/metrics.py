"""Validator metrics. Rule ids are a fixed set, so they are fine as labels."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from switchyard.metrics import LATENCY_BUCKETS

DECISIONS = Counter(
    "sy_sql_validations_total", "Validations by verdict and rule", ["verdict", "rule"]
)
LATENCY = Histogram(
    "sy_sql_validate_duration_seconds", "Time to validate one statement", buckets=LATENCY_BUCKETS
)
AUDIT_FAILURES = Counter(
    "sy_sql_validate_audit_failures_total", "Validator audit events that could not be published"
)
