"""The time window a question names, for a metric template's `days` parameter.

Deterministic on purpose: a metric's SQL is verified, and the only thing taken
from the question is an integer the template was written to accept. Metric
windows end at the latest day in the data, which the semantics document defines
as "yesterday" (the data is loaded daily, T+1): "yesterday" is a one-day window,
"the last 7 days" the seven most recent days. "Today" has no data yet, so it
names no window here.
"""

from __future__ import annotations

import re

_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
          "ten": 10, "fourteen": 14, "thirty": 30}  # fmt: skip
_N_DAYS = re.compile(
    r"\b(?:last|past|previous|recent)?\s*(\d{1,3}|" + "|".join(_WORDS) + r")\s+days?\b"
)
_N_WEEKS = re.compile(r"\b(\d{1,2}|" + "|".join(_WORDS) + r")\s+weeks?\b")
_NAMED = (
    (re.compile(r"\b(yesterday|latest day|last day)\b"), 1),
    (re.compile(r"\b(last|past|this|previous)\s+week\b|\bweekly\b"), 7),
    (re.compile(r"\b(last|past|this|previous)\s+(fortnight)\b"), 14),
    (re.compile(r"\b(last|past|this|previous)\s+month\b|\bmonthly\b"), 30),
)
_BEFORE = re.compile(r"\b(before|earlier|ago|prior)\b")
MAX_DAYS = 366


def _count(token: str) -> int:
    return int(token) if token.isdigit() else _WORDS[token]


def days_in(question: str) -> int | None:
    """The number of days a question asks about, or None when it names none."""
    text = question.lower()
    if _BEFORE.search(text):
        return None  # "the day before yesterday", "the 7 days before that": not a window
    if m := _N_DAYS.search(text):
        return max(1, min(MAX_DAYS, _count(m.group(1))))
    if m := _N_WEEKS.search(text):
        return max(1, min(MAX_DAYS, 7 * _count(m.group(1))))
    for pattern, days in _NAMED:
        if pattern.search(text):
            return days
    return None
