"""The time window a question names, for a metric template's `days` parameter.

Deterministic on purpose: a metric's SQL is verified, and the only thing taken
from the question is an integer the template was written to accept. Metric
windows end at the latest day in the data, which the semantics document defines
as "yesterday" (the data is loaded daily, T+1): "yesterday" is a one-day window,
"the last 7 days" the seven most recent days. "Today" has no data yet, so it
names no window here.

English and simplified Chinese (issue #22) follow the same rules, one table of
patterns each:

- a count of days, weeks (7 days), months (30) or years (365): "the last 14 days",
  "过去两周", "近一个月", "最近一年";
- a named window: "yesterday" / 昨天 (1), "last week" / 上周 / 本周 (7), "last
  month" / 上个月 / 本月 (30), as the semantics document reads "last week" (the
  last 7 days) and "last month" (the last 30);
- a grouping word as a last resort: "weekly" / 每周 (7), "monthly" / 每月 (30);
- none when the question places its period before another one ("the day before
  yesterday" / 前天, "7 days ago" / 7天前, "the 7 days before that" / 再往前7天):
  that is one earlier day or an earlier window, never the window ending yesterday;
- none for a calendar period no day count expresses ("this year" / 今年, "last
  year" / 去年, a quarter, a calendar month): `names_unexpressed_period` says so,
  so that a template is not run with its default window instead.
"""

from __future__ import annotations

import re
import unicodedata

MAX_DAYS = 366
_WEEK, _MONTH, _YEAR = 7, 30, 365

# -- English ------------------------------------------------------------------------
# ASCII word boundaries: in "过去7 days" or "昨天的dau" a CJK character is a word
# character to Unicode-aware \b, which would hide the English next to it.
_A = re.ASCII
_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
          "eight": 8, "nine": 9, "ten": 10, "fourteen": 14, "thirty": 30}  # fmt: skip
_EN_NUM = r"(\d{1,3}|" + "|".join(_WORDS) + r")"
_N_DAYS = re.compile(r"\b(?:last|past|previous|recent)?\s*" + _EN_NUM + r"\s+days?\b", _A)
_N_WEEKS = re.compile(r"\b" + _EN_NUM + r"\s+weeks?\b", _A)
_N_MONTHS = re.compile(r"\b" + _EN_NUM + r"\s+months?\b", _A)
_N_YEARS = re.compile(r"\b" + _EN_NUM + r"\s+years?\b", _A)
_NAMED = (
    (re.compile(r"\b(yesterday|latest day|last day)\b", _A), 1),
    (re.compile(r"\b(last|past|this|previous)\s+week\b", _A), _WEEK),
    (re.compile(r"\b(last|past|this|previous)\s+(fortnight)\b", _A), 14),
    (re.compile(r"\b(last|past|this|previous)\s+month\b", _A), _MONTH),
    # "past year" is the rolling year; "last year" and "this year" are calendar years.
    (re.compile(r"\bpast\s+year\b", _A), _YEAR),
)
# Groupings, not windows; taken only when nothing above names one, so "weekly revenue
# this month" is the month.
_GROUPINGS = (
    (re.compile(r"\bweekly\b", _A), _WEEK),
    (re.compile(r"\bmonthly\b", _A), _MONTH),
)
# "before" only where it relates two times ("the day before yesterday", "the 7 days
# before that", "registered before that day"): "revenue before and after refunds"
# over the past week is still the past week.
_BEFORE = re.compile(
    r"\b(?:days?|weeks?|weekday|months?|years?|that|then|yesterday)\s+(?:before|earlier|prior)\b"
    r"|\bbefore\s+(?:yesterday|that|then|the\s+(?:latest|last|most\s+recent))\b"
    r"|\bprior\s+to\b|\bearlier\b|\bago\b",
    _A,
)
_EN_CALENDAR = re.compile(
    r"\b(?:this|last|previous|prior)\s+(?:year|quarter)\b|\byear[\s-]to[\s-]date\b"
    r"|\b(?:ytd|qtd|q[1-4])\b|\bcalendar\s+(?:weeks?|months?|years?)\b"
    r"|\b(?:full|complete)\s+(?:[a-z-]+\s+)?(?:weeks?|months?)\b"
    r"|\bmonday[\s-]+(?:based|to[\s-]+sunday)\b|\bweeks?\s+(?:start|begin)\w*\s+(?:on\s+)?monday\b"
    r"|\b(?:in|during|for|since)\s+(?:19|20)\d\d\b",
    _A,
)

# -- Chinese ------------------------------------------------------------------------
_ZH_ZERO = "零〇"
_ZH_DIGITS = {"一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5,
              "六": 6, "七": 7, "八": 8, "九": 9}  # fmt: skip
_ZH_UNITS = {"十": 10, "百": 100}
_ZH_NUMERAL = "零〇一二两三四五六七八九十百"
_ZH_NUM = rf"([0-9]{{1,3}}|[{_ZH_NUMERAL}]{{1,5}})"
# A count starts a token: not the tail of a longer number ("十四" is not "四"), not an
# ordinal (第7天 "day 7"), not one day picked out of several (哪一天 "which day", 同一天
# "the same day", 每一天 "every day"), not the day of a date (3月7日 "7 March").
_ZH_LEAD = rf"(?<![0-9{_ZH_NUMERAL}第哪同某那每月])"
# 7日留存 / 30日LTV is the metric's horizon (D7 retention), not the period asked about.
_ZH_HORIZON = r"(?!\s*(?:留存|ltv|roi))"
_ZH_WINDOW_PREFIX = r"(?:过去|最近|近)"
# 前N天 is read as "the previous N days", the last N days: that is how operators use it
# in reports ("前7天的DAU"), and English "previous 7 days" is 7 too. "N days ago" is
# N天前 (the unit before 前), and "the day before" 前一天 is one earlier day, like
# "the day before yesterday" (前天); both are in _ZH_BEFORE, which is checked first.
_ZH_N_DAYS = re.compile(_ZH_LEAD + _ZH_NUM + r"\s*个?\s*(?:自然|整)?\s*[天日]" + _ZH_HORIZON)
# 自然周 / 完整的周 are calendar weeks: not a count of days (see _ZH_CALENDAR).
_ZH_N_WEEKS = re.compile(_ZH_LEAD + _ZH_NUM + r"\s*个?\s*(?:星期|周|礼拜)")
# 3个月 is three months; 3月 alone is March, a count only after 近 / 过去 / 最近.
_ZH_N_MONTHS = re.compile(rf"{_ZH_LEAD}{_ZH_NUM}\s*个\s*月|{_ZH_WINDOW_PREFIX}\s*{_ZH_NUM}\s*月")
# A year is a count only as a span (近一年, 一年内): 2024年 and 去年 are calendar years.
_ZH_N_YEARS = re.compile(
    rf"{_ZH_WINDOW_PREFIX}\s*{_ZH_NUM}\s*个?\s*年|{_ZH_LEAD}{_ZH_NUM}\s*年(?:内|来|以来)"
)
# 上周一 is last Monday and 每周日 every Sunday: single days, not weeks; 上周日活 is
# last week's DAU (日活) and 上周日均 its daily average.
_NOT_WEEKDAY = r"(?![一二三四五六末]|[日天](?![活均]))"
_ZH_NAMED = (
    (re.compile(r"昨天|昨日"), 1),
    (re.compile(r"(?:上|本|这)个?(?:星期|周|礼拜)" + _NOT_WEEKDAY), _WEEK),
    (re.compile(r"上个?月|本月|这个?月"), _MONTH),
)
_ZH_GROUPINGS = (
    (re.compile(r"每个?(?:星期|周|礼拜)" + _NOT_WEEKDAY), _WEEK),
    (re.compile(r"每个?月"), _MONTH),
)
# A count after 前 is a rank, not a time: 近7天前三名 is the top three of the last 7 days.
_NOT_RANK = rf"(?!\s*[0-9{_ZH_NUMERAL}]+\s*(?:名|位|个|大|的))"
_ZH_BEFORE = re.compile(
    r"前天"  # the day before yesterday (大前天 too)
    r"|前\s*[一1]\s*[天日]"  # the day before
    # 7天前, 一周之前: ago
    rf"|{_ZH_LEAD}{_ZH_NUM}\s*个?\s*(?:天|日|星期|周|礼拜|月|年)\s*[之以]?前{_NOT_RANK}"
    # before that (那之前, 此前, 再之前), before yesterday, the 7 days before (之前的7天)
    rf"|(?:那|这|再|昨天|昨日|当天)\s*[之以]前|此前|之前的\s*{_ZH_NUM}"
    r"|再往前|往前推|更早"
)
_ZH_CALENDAR = re.compile(
    r"今年|去年|前年|本年|上年|全年|年初|年度|季度|本季|上季|这季"
    r"|自然周|自然月|完整的?(?:星期|周|礼拜|月)|周一[到至]周日|以周一为"
    r"|(?:19|20)\d\d\s*年"
)


def chinese_numeral(token: str) -> int | None:
    """The value of a count written in digits or Chinese numerals ("14", "十四", "两",
    "二十", "一百零五"), or None when it is not one (two digits in a row, as in 五六天
    "five or six days", are an estimate, not a count)."""
    if token.isascii() and token.isdigit():
        return int(token)
    if not token:
        return None
    total, current, after_digit = 0, 0, False
    for ch in token:
        if ch in _ZH_ZERO:
            after_digit = False  # a place holder: 一百零五 is 105
        elif ch in _ZH_DIGITS:
            if after_digit:
                return None
            current, after_digit = _ZH_DIGITS[ch], True
        elif ch in _ZH_UNITS:
            # A bare unit counts one of itself: 十四 is 14, 百 is 100.
            total += (current or 1) * _ZH_UNITS[ch]
            current, after_digit = 0, False
        else:
            return None
    return total + current


def _count(token: str) -> int | None:
    return _WORDS[token] if token in _WORDS else chinese_numeral(token)


def _normal(question: str) -> str:
    # NFKC: full-width digits and letters (７天, ＤＡＵ) become ASCII ones.
    return unicodedata.normalize("NFKC", question).lower()


def _first_count(patterns: tuple[re.Pattern[str], ...], text: str) -> int | None:
    for pattern in patterns:
        for m in pattern.finditer(text):
            token = next(g for g in m.groups() if g is not None)
            if (count := _count(token)) is not None:
                return count
    return None


# A count of cohorts ("the last 30 mature cohorts", 最近7个成熟批次): the window of a
# retention metric, whose days are cohort days. No window of days_in: cohorts are
# registration days, counted back from the latest mature one, not from yesterday.
_N_COHORTS = re.compile(
    r"\b(?:last|latest|past|recent|most\s+recent)\s+" + _EN_NUM
    + r"\s+(?:[a-z-]+\s+){0,3}cohorts?\b", _A
)  # fmt: skip
_ZH_N_COHORTS = re.compile(rf"(?:最近|近|最新的?)\s*{_ZH_NUM}\s*个[^，,。？?]{{0,12}}?批次")


def cohorts_in(question: str) -> int | None:
    """The number of cohorts a question counts back, or None when it counts none."""
    return _first_count((_N_COHORTS, _ZH_N_COHORTS), _normal(question))


def names_unexpressed_period(question: str) -> bool:
    """The question names a calendar period (this year, last year, a quarter, a calendar
    month or week, a year by number) that no number of days ending yesterday expresses."""
    text = _normal(question)
    return bool(_EN_CALENDAR.search(text) or _ZH_CALENDAR.search(text))


def days_in(question: str) -> int | None:
    """The number of days a question asks about, or None when it names none."""
    text = _normal(question)
    if names_unexpressed_period(text):
        return None
    if _BEFORE.search(text) or _ZH_BEFORE.search(text):
        return None  # "the day before yesterday", "the 7 days before that": not a window
    for patterns, unit in (
        ((_N_DAYS, _ZH_N_DAYS), 1),
        ((_N_WEEKS, _ZH_N_WEEKS), _WEEK),
        ((_N_MONTHS, _ZH_N_MONTHS), _MONTH),
        ((_N_YEARS, _ZH_N_YEARS), _YEAR),
    ):
        if (count := _first_count(patterns, text)) is not None:
            return max(1, min(MAX_DAYS, unit * count))
    for pattern, days in (*_NAMED, *_ZH_NAMED, *_GROUPINGS, *_ZH_GROUPINGS):
        if pattern.search(text):
            return days
    return None
