"""Whether a verified metric answers a question, and with which parameters.

Embedding similarity alone is a poor judge here: on the demo evaluation set,
"D1 retention by region" scores 0.69 against the D1 metric and "DAU over the
last 5 days" only 0.57 against DAU. So a metric is taken only when, besides a
minimum similarity, the question names it (its name or a synonym, as a phrase),
names no other metric, asks for the metric's shape (a series per day or per
cohort, not one total, average or peak) and for no breakdown the metric does not
have ("by server", "per region"). Everything else goes to generation, which can
write the aggregate or the breakdown.
"""

from __future__ import annotations

import re

from switchyard.text2sql.knowledge import Metric
from switchyard.text2sql.normalise import normalise_question
from switchyard.text2sql.timeframe import days_in

# Columns a question can break a metric down by; "day" is every metric's own grain.
DIMENSIONS = {
    "server": "server", "servers": "server", "shard": "server", "shards": "server",
    "region": "region", "regions": "region", "channel": "channel", "channels": "channel",
    "source": "channel", "device": "device", "devices": "device", "platform": "device",
    "country": "country", "countries": "country", "tier": "tier", "tiers": "tier",
    "level": "level", "levels": "level", "provider": "provider", "reason": "reason",
    "cohort": "cohort", "cohorts": "cohort", "week": "week", "weeks": "week",
    "weekday": "week", "month": "month", "months": "month", "status": "status",
}  # fmt: skip
_GROUPING = re.compile(
    r"\b(?:by|per|each|every|across|between)\s+(?:(?:acquisition|ua|payment|pay|game|"
    r"registration|cohort)\s+)?(\w+)"
)
_TOP = re.compile(r"\btop\s+(\d{1,3})\b|\b(\d{1,3})\s+(?:best|top|highest|biggest|largest)?\s*"
                  r"(?:servers|channels|regions|players|spenders|levels)\b")  # fmt: skip


# The demo metrics are series (one row per day or cohort): a question must ask for one.
_SERIES = re.compile(
    r"\b(per day|each day|every day|daily|day by day|by day|trend|each of the|over time|"
    r"per cohort|cohorts)\b"
)
# ... and not a single number made from one (those are written by generation).
_REDUCTION = re.compile(
    r"\b(average|avg|mean|total|sum|overall|peak|highest|lowest|max|maximum|min|minimum|"
    r"most|least|best|worst|compare|compared|versus|vs|which|as a whole|share|ratio of)\b"
)


def asks_for_series(question: str) -> bool:
    text = question.lower()
    return bool(_SERIES.search(text)) and not _REDUCTION.search(text)


def _without_names(question: str, metric: Metric) -> str:
    """The question minus the metric's own name ("daily active users" says no "daily")."""
    text = f" {normalise_question(question)} "
    for phrase in sorted(_phrases(metric), key=len, reverse=True):
        text = re.sub(rf"(?<![\w-]){re.escape(phrase)}(?![\w-])", " ", text)
    return text


def dimensions(text: str) -> set[str]:
    return {DIMENSIONS[w] for w in _GROUPING.findall(text.lower()) if w in DIMENSIONS}


def _phrases(metric: Metric) -> list[str]:
    names = [metric.name, metric.name.replace("_", " "), *metric.synonyms]
    return [normalise_question(n) for n in names if n.strip()]


def names_metric(question: str, metric: Metric) -> bool:
    text = f" {normalise_question(question)} "
    return any(re.search(rf"(?<![\w-]){re.escape(p)}(?![\w-])", text) for p in _phrases(metric))


def answers(question: str, metric: Metric, others: list[Metric]) -> bool:
    """The metric is what the question asks for, in its shape, without a breakdown
    it lacks; `others` are the tenant's other metrics (none may be named too)."""
    own = dimensions(f"{metric.description} {metric.sql}")
    return (
        names_metric(question, metric)
        and not any(names_metric(question, o) for o in others if o.name != metric.name)
        and asks_for_series(_without_names(question, metric))
        and dimensions(question) <= own
    )


def parameters(question: str, metric: Metric) -> dict[str, int]:
    """The integer parameters the question sets (its window, a top-N); defaults otherwise."""
    params: dict[str, int] = {}
    days = days_in(question)
    if days is not None and "days" in metric.params:
        params["days"] = days
    if "top" in metric.params and (m := _TOP.search(question.lower())):
        params["top"] = max(1, min(100, int(m.group(1) or m.group(2))))
    return params
