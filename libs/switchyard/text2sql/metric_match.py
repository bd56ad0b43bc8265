"""Whether a verified metric answers a question, and with which parameters.

Embedding similarity is a poor judge here: a question about a breakdown ("D1
retention by region") or one number ("DAU yesterday") scores close to the metric
whose shape it does not have. So a metric is taken only when the question names
it (its name, a synonym or a term of the same name, in English or Chinese:
`vocabulary`), names no other metric, asks for the metric's shape (a series per
day or per cohort, not one total, average or peak) and for no breakdown the metric
does not have ("by server", "按渠道"), and names no period a day count cannot
express (今年, "this year"). Everything else goes to generation, which can write
the aggregate or the breakdown.
"""

from __future__ import annotations

import re

from switchyard.text2sql.knowledge import Metric
from switchyard.text2sql.timeframe import cohorts_in, days_in, names_unexpressed_period
from switchyard.text2sql.vocabulary import Vocabulary

# Columns a question can break a metric down by; "day" is every metric's own grain.
DIMENSIONS = {
    "server": "server", "servers": "server", "shard": "server", "shards": "server",
    "region": "region", "regions": "region", "channel": "channel", "channels": "channel",
    "source": "channel", "device": "device", "devices": "device", "platform": "device",
    "country": "country", "countries": "country", "tier": "tier", "tiers": "tier",
    "level": "level", "levels": "level", "provider": "provider", "reason": "reason",
    "cohort": "cohort", "cohorts": "cohort", "week": "week", "weeks": "week",
    "weekday": "week", "month": "month", "months": "month", "status": "status",
    "服务器": "server", "区服": "server", "地区": "region", "大区": "region",
    "区域": "region", "渠道": "channel", "来源": "channel", "设备": "device",
    "平台": "device", "机型": "device", "国家": "country", "档位": "tier",
    "关卡": "level", "支付商": "provider", "原因": "reason", "批次": "cohort",
    "周": "week", "月": "month", "状态": "status",
}  # fmt: skip
_GROUPING = re.compile(
    r"\b(?:by|per|each|every|across|between)\s+(?:(?:acquisition|ua|payment|pay|game|"
    r"registration|cohort)\s+)?(\w+)"
)
# Chinese puts the grouping word before the dimension: 按渠道, 各服务器, 每个地区, 分平台.
_CJK_GROUPING = re.compile(
    r"(?:按照|按|各个|各|每个|每一个|分)\s*(?:支付|付费|注册)?("
    + "|".join(sorted((w for w in DIMENSIONS if not w.isascii()), key=len, reverse=True))
    + ")"
)
_TOP = re.compile(
    r"\btop\s+(\d{1,3})\b|\b(\d{1,3})\s+(?:best|top|highest|biggest|largest)?\s*"
    r"(?:servers|channels|regions|players|spenders|levels)\b|前\s*(\d{1,3})\s*(?:名|个|位)"
)


# The demo metrics are series (one row per day or cohort): a question must ask for one,
# in its own words or in a metric's ("daily revenue", 每日流水) - except where "daily"
# is part of the name of one number, daily active users (日活跃用户, 每日活跃用户).
_SERIES = re.compile(
    r"\b(per day|each day|every day|daily(?! actives?\b)|day by day|by day|trend|each of the|"
    r"over time|per cohort|cohorts)\b|每天|每日(?!活跃)|每一天|按天|按日|逐日|分天|趋势|走势|"
    r"变化|曲线|批次"
)
# ... and not a single number made from one (those are written by generation).
_REDUCTION = re.compile(
    r"\b(average|avg|mean|total|sum|overall|peak|highest|lowest|max|maximum|min|minimum|"
    r"most|least|best|worst|compare|compared|versus|vs|which|as a whole|share|ratio of)\b"
    r"|平均|均值|总|合计|一共|峰值|最高|最低|最多|最少|最大|最小|最好|最差|对比|比较|相比|哪|占比|比例"
)


def asks_for_series(question: str, rest: str) -> bool:
    """The question asks for a series, not one number; `rest` is the question without
    its metrics' names, whose words ("average revenue per user") reduce nothing."""
    return bool(_SERIES.search(question.lower())) and not _REDUCTION.search(rest.lower())


def dimensions(text: str) -> set[str]:
    lowered = text.lower()
    found = [*_GROUPING.findall(lowered), *_CJK_GROUPING.findall(lowered)]
    return {DIMENSIONS[w] for w in found if w in DIMENSIONS}


def answers(question: str, metric: Metric, vocabulary: Vocabulary) -> bool:
    """The metric is what the question asks for, in its shape, without a breakdown
    it lacks, and it is the only metric of `vocabulary` (the tenant's) it names."""
    reading = vocabulary.read(question)
    own = dimensions(f"{metric.description} {metric.sql}")
    return (
        reading.concepts & vocabulary.metrics == {metric.name}
        and asks_for_series(question, reading.rest)
        and dimensions(question) <= own
        and not names_unexpressed_period(question)
    )


def parameters(question: str, metric: Metric) -> dict[str, int]:
    """The integer parameters the question sets (its window, a top-N); defaults otherwise."""
    params: dict[str, int] = {}
    days = days_in(question)
    if days is None:  # a retention metric's days are cohort days
        days = cohorts_in(question)
    if days is not None and "days" in metric.params:
        params["days"] = days
    if "top" in metric.params and (m := _TOP.search(question.lower())):
        params["top"] = max(1, min(100, int(next(g for g in m.groups() if g))))
    return params
