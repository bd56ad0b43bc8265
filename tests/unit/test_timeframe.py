"""The time window a question names, in English, simplified Chinese and a mix of both."""

from __future__ import annotations

import pytest

from switchyard.text2sql.timeframe import (
    MAX_DAYS,
    chinese_numeral,
    days_in,
    names_unexpressed_period,
)


@pytest.mark.parametrize(
    ("token", "value"),
    [
        ("7", 7), ("一", 1), ("两", 2), ("二", 2), ("七", 7), ("十", 10), ("十四", 14),
        ("二十", 20), ("二十八", 28), ("三十", 30), ("九十", 90), ("一百", 100), ("百", 100),
        ("两百", 200), ("一百二十", 120), ("一百零五", 105),
        ("五六", None), ("一两", None), ("", None), ("几", None),
    ],
)  # fmt: skip
def test_chinese_numeral(token: str, value: int | None) -> None:
    assert chinese_numeral(token) == value


@pytest.mark.parametrize(
    ("question", "days"),
    [
        # one day: the latest day in the data
        ("昨天", 1), ("昨日", 1), ("昨天的DAU是多少？", 1), ("昨日注册用户数", 1),
        ("最新一天各区服的日活", 1), ("最近一天的流水", 1),
        # N days, in digits and in numerals
        ("过去7天", 7), ("最近7天", 7), ("近7天", 7), ("过去七天", 7), ("最近三十天", 30),
        ("近30日", 30), ("过去 14 天", 14), ("过去十四天的收入", 14), ("近二十天", 20),
        ("最近两天", 2), ("过去一百天", 100), ("最近7个自然日", 7), ("30日内的退款", 30),
        ("近7日活跃", 7), ("过去７天", 7),
        # weeks
        ("最近两周", 14), ("过去2周", 14), ("近两个星期", 14), ("过去一周", 7),
        ("最近一个星期", 7), ("近三周", 21), ("两个礼拜", 14),
        ("上周", 7), ("上星期", 7), ("本周", 7), ("这周", 7), ("上个礼拜", 7),
        # months and years
        ("本月", 30), ("这个月", 30), ("上个月", 30), ("上月", 30), ("近一个月", 30),
        ("最近一个月", 30), ("近3个月", 90), ("过去一年", 365), ("最近一年", 365),
        ("近一年", 365), ("一年内", 365),
        # groupings, when nothing names a window
        ("每周", 7), ("每个星期的注册", 7), ("每月", 30), ("每个月的流水", 30),
        # 前N天 is "the previous N days", as English "previous 7 days"
        ("前7天", 7), ("前两周的付费", 14), ("previous 7 days", 7),
    ],
)  # fmt: skip
def test_chinese_windows(question: str, days: int) -> None:
    assert days_in(question) == days


@pytest.mark.parametrize(
    ("question", "days"),
    [
        ("过去7天的DAU", 7),
        ("DAU 最近两周每天是多少", 14),  # a window and a per-day series: the window
        ("过去7天的 revenue 按渠道", 7),
        ("最近两周每天的 revenue 走势", 14),
        ("近一个月流水按渠道拆一下，美元", 30),
        ("过去一周日活按天拉一下", 7),
        ("最近7天每天的ARPU", 7),
        ("过去30天里哪一天日活最高？", 30),  # 哪一天 "which day" is no window
        ("最近7天和昨天比", 7),  # a count before a named day, as "last 7 days vs yesterday"
        ("上周日活是多少", 7),  # 上周 + 日活 (DAU), not 上周日 (last Sunday)
        ("上周日均付费", 7),
        ("近7天充值前十的玩家", 7),  # 前十 is a rank
        ("近7天前三名的服务器", 7),
        ("过去30天的7日留存", 30),  # 7日留存 is D7 retention, not the window
        ("本月每周的流水", 30),  # the window wins over the grouping
        ("DAU over the past 7 days, 按渠道", 7),
        ("过去7 days的DAU", 7),  # English next to CJK characters
        ("昨天的 revenue", 1),
    ],
)
def test_mixed_sentences(question: str, days: int) -> None:
    assert days_in(question) == days


@pytest.mark.parametrize(
    "question",
    [
        "今天的日活",  # no data for today
        "前天的日活是多少？",  # one earlier day, like "the day before yesterday"
        "大前天",
        "前一天的流水",  # "the day before"
        "7天前的DAU",  # "7 days ago": one earlier day
        "三天之前",
        "一周前的同一天",
        "两个月前",
        "之前的7天",  # "the 7 days before that"
        "最近7天的收入和再往前7天比",
        "此前的注册",
        "第7天还在玩的玩家",  # day 7, an ordinal
        "哪一天日活最高",
        "7日留存",  # D7 retention, a metric's horizon
        "30日LTV",
        "次日留存",
        "上周一的日活",  # last Monday, one day
        "每周日的活动",  # every Sunday
        "3月7日的收入",  # a date
        "五六天",  # an estimate
        "最近几天",
        "各渠道的收入",
        "前十名的玩家",
        "最近7个成熟批次的次日留存",  # 7 cohorts, not 7 days
        "编号1的玩家最长的一次会话",
    ],
)
def test_chinese_without_a_window(question: str) -> None:
    assert days_in(question) is None


@pytest.mark.parametrize(
    "question",
    [
        "今年的流水", "去年的注册", "前年", "本年度收入", "今年以来的DAU", "年初至今的收入",
        "本季度", "上季度的付费", "2024年的营收", "最近四个完整自然周的收入", "按自然月统计",
        "this year", "last year's revenue", "revenue year to date", "YTD revenue",
        "this quarter", "revenue in 2024", "revenue per calendar month",
        "the last four complete Monday-to-Sunday weeks", "weeks start Monday",
    ],
)  # fmt: skip
def test_calendar_periods_are_named_but_not_counted(question: str) -> None:
    assert names_unexpressed_period(question)
    assert days_in(question) is None


@pytest.mark.parametrize(
    "question",
    ["过去一年", "近一年的收入", "past year", "过去7天", "本月", "last month", "昨天", "各渠道"],
)
def test_rolling_periods_are_not_calendar_ones(question: str) -> None:
    assert not names_unexpressed_period(question)


def test_calendar_period_wins_over_a_grouping() -> None:
    # "weekly" alone is 7 days; this year's weeks are not the last 7 days.
    assert days_in("weekly revenue") == 7
    assert days_in("weekly revenue this year") is None
    assert days_in("今年每周的流水") is None


@pytest.mark.parametrize(
    ("english", "chinese"),
    [
        ("What was DAU yesterday?", "昨天的日活是多少？"),
        ("DAU on the day before yesterday", "前天的日活"),
        ("DAU for each of the last 7 days", "最近7天每天的日活"),
        ("revenue over the past week", "过去一周的收入"),
        ("new players over the last 14 days", "近十四天的新增"),
        ("payers in the last 2 weeks", "最近两周的付费人数"),
        ("revenue last month", "上个月的收入"),
        ("revenue over the past month", "近一个月的收入"),
        ("payers this week", "本周付费人数"),
        ("weekly registrations", "每周的注册数"),
        ("monthly revenue", "每月的流水"),
        ("revenue over the past year", "过去一年的收入"),
        ("revenue last year", "去年的收入"),
        ("revenue this year", "今年的收入"),
        ("DAU 3 days ago", "3天前的日活"),
        ("revenue in the last 7 days compared to the 7 days before", "最近7天的收入和再往前7天比"),
        ("DAU one week earlier", "一周之前的日活"),
        ("revenue by channel", "各渠道的收入"),
        ("revenue today", "今天的收入"),
    ],
)
def test_chinese_follows_the_english_rules(english: str, chinese: str) -> None:
    assert days_in(chinese) == days_in(english)
    assert names_unexpressed_period(chinese) == names_unexpressed_period(english)


def test_before_relates_two_times_only() -> None:
    # "before and after refunds" over the past week is still the past week...
    assert days_in("Revenue per day over the past week, before and after refunds") == 7
    assert days_in("过去一周每天的营收，退款前和退款后") == 7
    # ... while a day or window placed before another one is none.
    for question in (
        "the day before yesterday",
        "the 7 days before that",
        "players who registered before that day",
        "revenue a week before",
        "DAU 7 days ago",
        "revenue prior to yesterday",
    ):
        assert days_in(question) is None, question


def test_counts_are_clamped() -> None:
    assert days_in("过去两年") == MAX_DAYS
    assert days_in("过去500天") == MAX_DAYS
    assert days_in("last 400 days") == MAX_DAYS
    assert days_in("最近0天") == 1
