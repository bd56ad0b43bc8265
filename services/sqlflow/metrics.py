"""Sqlflow metrics: answers by path and status, and the latency of each stage."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from switchyard.metrics import LATENCY_BUCKETS

ANSWERS = Counter(
    "sy_sqlflow_answers_total", "Questions answered, by path and status", ["path", "status"]
)
STAGE_SECONDS = Histogram(
    "sy_sqlflow_stage_duration_seconds", "Time spent in each pipeline stage", ["stage"],
    buckets=LATENCY_BUCKETS,
)  # fmt: skip
ANSWER_SECONDS = Histogram(
    "sy_sqlflow_answer_duration_seconds", "Question to answer, by path", ["path"],
    buckets=LATENCY_BUCKETS,
)  # fmt: skip
SUMMARY_REPLACED = Counter(
    "sy_sqlflow_summary_replaced_answers_total",
    "Answers whose model summary was replaced by the template: it stated a number, date "
    "or name not among the result's facts",
)
