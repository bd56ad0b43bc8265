"""The pipeline's deterministic parts: chart choice, caches, time windows, result digests."""

from __future__ import annotations

import pytest

from switchyard.text2sql import metric_match
from switchyard.text2sql.caches import TtlCache
from switchyard.text2sql.chart import chart_for
from switchyard.text2sql.knowledge import KnowledgeStore, Metric, TenantKnowledge
from switchyard.text2sql.matching import VERIFIED_THRESHOLD, reusable, specifics
from switchyard.text2sql.prompts import Failure, result_digest, retry_messages, sql_messages
from switchyard.text2sql.timeframe import days_in
from switchyard.text2sql.vocabulary import Vocabulary
from tests.conftest import REPO

# The shipped game-ops vocabulary (metrics.yaml and terms.yaml), as acme reads it.
PACK = Vocabulary.of(KnowledgeStore(REPO / "deploy" / "knowledge").load("acme"))


def test_chart_line_for_a_time_series() -> None:
    spec = chart_for(["day", "dau"], [["2025-01-01", 10], ["2025-01-02", 12]])
    assert spec is not None and spec["mark"] == "line"
    assert spec["encoding"]["x"] == {"field": "day", "type": "temporal"}
    assert spec["data"]["values"][1] == {"day": "2025-01-02", "dau": 12}


def test_chart_folds_several_measures_over_time() -> None:
    spec = chart_for(["day", "dau", "new"], [["2025-01-01", 10, 1], ["2025-01-02", 12, 2]])
    assert spec is not None and spec["transform"][0]["fold"] == ["dau", "new"]


def test_chart_bars_for_a_category_and_decimal_text() -> None:
    spec = chart_for(["channel", "revenue"], [["organic", "10.50"], ["referral", "3.25"]])
    assert spec is not None and spec["mark"] == "bar"
    assert spec["data"]["values"][0]["revenue"] == 10.5  # DECIMAL text becomes a number


def test_chart_stacked_for_two_categories() -> None:
    rows = [["na", "ios", 3], ["na", "android", 4], ["eu", "ios", 1]]
    spec = chart_for(["region", "device", "players"], rows)
    assert spec is not None and spec["encoding"]["color"]["field"] == "device"


@pytest.mark.parametrize(
    ("columns", "rows"),
    [
        (["dau"], [[10]]),  # a single value is text, not a chart
        (["a", "b"], []),
        (["name", "kind", "id", "note"], [["x", "y", 1, "z"], ["x", "y", 2, "z"]]),
    ],
)
def test_no_chart(columns: list[str], rows: list[list[object]]) -> None:
    assert chart_for(columns, rows) is None  # type: ignore[arg-type]


def test_ttl_cache_expires_and_evicts() -> None:
    cache: TtlCache[int] = TtlCache(ttl=10, capacity=2)
    cache.put(("acme", "q1"), 1, now=0)
    assert cache.get(("acme", "q1"), now=5) == 1
    assert cache.get(("acme", "q1"), now=11) is None
    cache.put(("acme", "a"), 1, now=0)
    cache.put(("acme", "b"), 2, now=0)
    cache.put(("nova", "c"), 3, now=0)
    assert cache.get(("acme", "a"), now=1) is None and len(cache) == 2
    assert cache.get(("nova", "c"), now=1) == 3 and cache.get(("acme", "b"), now=1) == 2


def test_ttl_zero_disables() -> None:
    cache: TtlCache[int] = TtlCache(ttl=0)
    cache.put(("t",), 1)
    assert cache.get(("t",)) is None


@pytest.mark.parametrize(
    ("question", "days"),
    [
        ("DAU over the last 14 days", 14),
        ("revenue for the past seven days", 7),
        ("new players in the last 3 weeks", 21),
        ("what was DAU yesterday?", 1),
        ("payers last week", 7),
        ("monthly revenue", 30),
        ("revenue by channel", None),
        ("top 5 servers", None),
    ],
)
def test_days_in(question: str, days: int | None) -> None:
    assert days_in(question) == days


def test_digest_keeps_rows_away_unless_allowed() -> None:
    rows = [["organic", 1200, "secret-nick"], ["referral", 300, "other-nick"]]
    shape = result_digest(["channel", "revenue", "nick"], rows, include_rows=False)
    assert "secret-nick" not in shape and "organic" not in shape
    assert "2 row(s)" in shape and "revenue: min 300, max 1200, sum 1500" in shape
    assert "secret-nick" in result_digest(["c", "r", "n"], rows, include_rows=True)


def test_retry_prompt_carries_what_is_new() -> None:
    first = sql_messages("q?", "players: ...", "conventions", [])
    failure = Failure("validation", "column.not_allowed", "no column `nick`", [{"table": "p"}])
    msgs = retry_messages(first, "SELECT nick FROM players", failure, "players: a, b", "x: 1, 2")
    text = str(msgs[-1].content)
    assert msgs[-2].content == "SELECT nick FROM players"
    for needle in ("column.not_allowed", "no column `nick`", "players: a, b", "x: 1, 2", "EXPLAIN"):
        assert needle in text


@pytest.mark.parametrize(
    ("question", "stored", "same"),
    [
        ("What was DAU over the last 5 days?", "What was DAU yesterday?", False),
        ("What was the DAU yesterday", "What was DAU yesterday?", True),
        ("Top 10 spenders over the past week", "Who were the top 10 spenders in the last 7 days?",
         True),  # "last week" is the last 7 days (semantics.md)
        ("Top 5 spenders over the past week", "Who were the top 10 spenders in the last 7 days?",
         False),
        ("revenue by region last 7 days", "What was revenue by region over the last 30 days?",
         False),
        ("top 5 levels by completion", "Which 5 levels have the lowest completion rate?",
         False),  # the top and the lowest are not the same 5
        ("Which 5 levels have the worst completion rate?",
         "Which 5 levels have the lowest completion rate?", True),
        # Chinese against English: the same measure, window and numbers.
        ("昨天的日活是多少？", "What was DAU yesterday?", True),
        ("昨天有多少玩家注册？", "How many players registered yesterday?", True),
        ("昨天的日活是多少？", "昨天有多少玩家注册？", False),  # e5 cosine 0.89
        ("过去7天的总收入是多少美元？", "What was total revenue in dollars over the last 7 days?",
         True),
        ("最近7天消费最多的前10名玩家是谁？", "Who were the top 10 spenders in the last 7 days?",
         True),
        ("最近7天消费最多的前5名玩家是谁？", "Who were the top 10 spenders in the last 7 days?",
         False),
        ("What is D7 retention by channel for the last 30 mature cohorts?",
         "What is D1 retention by channel for the last 30 mature cohorts?", False),  # cos 0.96
    ],
)  # fmt: skip
def test_reuse_needs_the_same_specifics(question: str, stored: str, same: bool) -> None:
    assert (specifics(question, PACK) == specifics(stored, PACK)) is same


def test_questions_naming_nothing_are_reused_only_as_near_repeats() -> None:
    asked = "count every player we have ever had"
    assert reusable(asked, asked.upper(), 0.99, VERIFIED_THRESHOLD, PACK)
    assert not reusable(asked, "count every player we ever lost", 0.9, VERIFIED_THRESHOLD, PACK)
    assert not reusable("DAU yesterday", "DAU yesterday", 0.5, VERIFIED_THRESHOLD, PACK)


DAU = Metric(
    name="dau", description="Daily active users per day for the last {days} days.",
    synonyms=["daily active users", "daily actives"],
    sql="SELECT day, SUM(dau) FROM agg_dau_daily WHERE day > (SELECT MAX(day) FROM "
        "agg_dau_daily) - INTERVAL {days} DAY GROUP BY day", params={"days": 7},
)  # fmt: skip
TOP = Metric(
    name="top_servers_by_revenue", description="The {top} servers with the highest revenue.",
    synonyms=["best servers by revenue"], sql="SELECT server_id FROM agg_revenue_daily "
    "GROUP BY server_id LIMIT {top}", params={"top": 5},
)  # fmt: skip
NEW = Metric(name="new_players", description="New players per day.", synonyms=["installs"],
             sql="SELECT day, SUM(new_players) FROM agg_dau_daily GROUP BY day")  # fmt: skip


@pytest.mark.parametrize(
    ("question", "taken"),
    [
        ("Show DAU for each of the last 7 days", True),
        ("Daily active users over the past week, day by day", True),
        ("DAU trend over the last 14 days", True),
        ("What was DAU yesterday?", False),  # one number, not the series
        ("What was the average DAU over the last 7 days?", False),  # a reduction
        ("Number of daily active users on the day before yesterday", False),
        ("DAU per region for each of the last 7 days", False),  # a breakdown it lacks
        ("Daily new players and DAU for the last 7 days", False),  # two metrics named
        ("Show players for each of the last 7 days", False),  # does not name it
    ],
)
def test_metric_answers_only_its_own_shape(question: str, taken: bool) -> None:
    knowledge = TenantKnowledge(tenant="t", pack="p", views=[], semantics="",
                                metrics=[DAU, TOP, NEW], verified=[])  # fmt: skip
    assert metric_match.answers(question, DAU, Vocabulary.of(knowledge)) is taken


@pytest.mark.parametrize(
    ("question", "metric"),
    [
        ("最近7天每天的日活", "dau"),
        ("过去两周日活趋势", "dau"),
        ("DAU 每天的变化，最近14天", "dau"),
        ("最近7天每天的新增玩家", "new_players"),
        ("过去30天每日流水", "revenue_daily"),
        ("近7天每天的付费人数", "paying_users"),
        ("最近7天每日付费用户人均收入", "arppu"),  # not also ARPU's 人均收入
        ("昨天的日活是多少", None),  # one number, not the series
        ("最近7天平均日活", None),  # a reduction
        ("最近7天各渠道每天的日活", None),  # a breakdown DAU lacks
        ("今年每天的日活", None),  # a period no day count expresses
    ],
)
def test_chinese_questions_name_the_packs_metrics(question: str, metric: str | None) -> None:
    knowledge = KnowledgeStore(REPO / "deploy" / "knowledge").load("acme")
    taken = [m.name for m in knowledge.metrics if metric_match.answers(question, m, PACK)]
    assert taken == ([metric] if metric else [])


def test_metric_parameters_from_the_question() -> None:
    assert metric_match.parameters("DAU trend over the last 14 days", DAU) == {"days": 14}
    assert metric_match.parameters("Show DAU per day", DAU) == {}
    assert metric_match.parameters("top 3 servers by revenue", TOP) == {"top": 3}
    assert metric_match.parameters("Which 10 servers earned most", TOP) == {"top": 10}
    # A count of cohorts is a retention metric's window (its days are cohort days).
    d1 = KnowledgeStore(REPO / "deploy" / "knowledge").load("acme").metric("d1_retention")
    assert d1 is not None
    for asked, days in (("What is D1 retention for the last 30 mature cohorts?", 30),
                        ("D1 retention of the latest 7 measurable cohorts", 7),
                        ("最近7个成熟批次（注册日截至前天）的次日留存是多少？", 7),
                        ("最近三十个批次的次日留存", 30)):  # fmt: skip
        assert metric_match.parameters(asked, d1) == {"days": days}, asked
