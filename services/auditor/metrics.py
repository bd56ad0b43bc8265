"""Auditor metrics."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from switchyard.metrics import LATENCY_BUCKETS

STORED = Counter("sy_audit_stored_events_total", "Audit events written to the table")
DUPLICATES = Counter("sy_audit_duplicate_events_total", "Redelivered audit events already stored")
BATCH_SECONDS = Histogram(
    "sy_audit_batch_duration_seconds", "Time to insert and commit one batch",
    buckets=LATENCY_BUCKETS,
)  # fmt: skip
FAILURES = Counter("sy_audit_batch_failures_total", "Batches that could not be stored")
