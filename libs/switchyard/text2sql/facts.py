"""The facts of a result, the summary sentence written from them, and the check that a
summary states nothing else.

`result_facts` reads the rows without a model: one value, a series (a date-like label
column and a numeric column), a breakdown (a text label column and one numeric
column), any other table, or nothing. `template_summary` writes one English sentence
from the facts alone. `ungrounded` lists what a summary states (numbers, dates, row
labels) that is neither among the facts nor in the question: a model's rephrasing
that states any is replaced by the template sentence.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from switchyard.messages.sql import Cell, FactPoint, FactShare, Number, ResultFacts

TOP_K = 3
MAX_VALUES = 8
MAX_DECIMALS = 4
# A measure whose name says it is a rate or an average has no meaningful total.
_NOT_ADDITIVE = re.compile(
    r"rate|ratio|pct|percent|share|avg|average|mean|median|retention|arpu|arppu|conversion|per_"
)
_DATE = re.compile(r"^\d{4}-\d{2}(-\d{2})?([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?$")
_DATE_NAME = re.compile(r"(^|_)(day|date|dt|week|month|year|hour|ts|time|period)s?($|_)")


# -- the facts ---------------------------------------------------------------------


def _number(cell: Cell) -> Number | None:
    if isinstance(cell, bool) or cell is None:
        return None
    if isinstance(cell, int | float):
        return cell if not isinstance(cell, float) or math.isfinite(cell) else None
    try:
        value = float(cell.replace(",", ""))
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return int(value) if re.fullmatch(r"-?\d+", cell.strip()) else value


def _decimals(cell: Cell) -> int:
    if isinstance(cell, float) and not cell.is_integer():
        text = repr(cell)
        return min(MAX_DECIMALS, len(text.split(".")[1])) if "." in text and "e" not in text else 2
    if isinstance(cell, str) and re.fullmatch(r"-?[\d,]*\.\d+", cell.strip()):
        return min(MAX_DECIMALS, len(cell.strip().split(".")[1]))
    return 0


def _is_date(cell: Cell) -> bool:
    return isinstance(cell, str) and _DATE.match(cell.strip()) is not None


def _label(cell: Cell) -> str:
    if isinstance(cell, str) and _DATE.match(cell.strip()):
        text = cell.strip().replace(" ", "T")
        return text.removesuffix("T00:00:00") if len(text) > 10 else text
    return "NULL" if cell is None else str(cell)[:256]


def _numeric_columns(rows: Sequence[Sequence[Cell]], width: int) -> list[int]:
    """Columns whose non-NULL cells are all numbers (and not all NULL)."""
    found = []
    for j in range(width):
        cells = [r[j] for r in rows if r[j] is not None]
        if cells and all(_number(c) is not None for c in cells):
            found.append(j)
    return found


def result_facts(
    columns: Sequence[str], rows: Sequence[Sequence[Cell]], truncated: bool = False
) -> ResultFacts:
    """The facts of a result, deterministically (see ResultFacts for each kind)."""
    base: dict[str, Any] = {
        "row_count": len(rows),
        "truncated": truncated,
        "columns": list(columns)[:512],
    }
    if not rows or not columns:
        return ResultFacts(kind="empty", **base)
    width = len(columns)
    if len(rows) == 1:
        values = [
            FactPoint(label=columns[j], value=_number(rows[0][j]))
            for j in range(min(width, MAX_VALUES))
            if rows[0][j] is None or _number(rows[0][j]) is not None
        ]
        if values and len(values) == min(width, MAX_VALUES):
            decimals = max((_decimals(c) for c in rows[0]), default=0)
            return ResultFacts(kind="value", values=values, decimals=decimals, **base)
    numeric = _numeric_columns(rows, width)
    first_is_label = 0 not in numeric or _DATE_NAME.search(columns[0].lower()) is not None
    measures = [j for j in numeric if j != 0]
    if width >= 2 and first_is_label and measures:
        m = measures[0]
        labels = [r[0] for r in rows]
        dated = all(_is_date(c) for c in labels if c is not None) and any(
            c is not None for c in labels
        )
        if dated or (_DATE_NAME.search(columns[0].lower()) and 0 in numeric):
            return _series(columns, rows, m, base)
        if len(measures) == 1 and all(isinstance(c, str | None) for c in labels):
            return _breakdown(columns, rows, m, base)
    return ResultFacts(kind="table", **base)


def _points(
    rows: Sequence[Sequence[Cell]], m: int, *, null_label: bool = False
) -> list[tuple[str, Number]]:
    """(label, value) of the rows with a value; a NULL label is a group of a breakdown
    (GROUP BY keeps it) but no point of a series."""
    found = []
    for row in rows:
        value = _number(row[m])
        if value is not None and (row[0] is not None or null_label):
            found.append((_label(row[0]), value))
    return found


def _series(
    columns: Sequence[str], rows: Sequence[Sequence[Cell]], m: int, base: dict[str, Any]
) -> ResultFacts:
    points = sorted(_points(rows, m), key=lambda p: (len(p[0]) if p[0].isdigit() else 0, p[0]))
    decimals = max((_decimals(r[m]) for r in rows), default=0)
    if not points:
        return ResultFacts(kind="table", **base)
    (fl, fv), (ll, lv) = points[0], points[-1]
    high = max(points, key=lambda p: p[1])
    low = min(points, key=lambda p: p[1])
    change = _round(lv - fv, decimals)
    pct = round(100.0 * (lv - fv) / abs(fv), 1) if fv else None
    return ResultFacts(
        kind="series", measure=columns[m], label=columns[0], decimals=decimals,
        first=FactPoint(label=fl, value=fv), last=FactPoint(label=ll, value=lv),
        high=FactPoint(label=high[0], value=high[1]), low=FactPoint(label=low[0], value=low[1]),
        change=change, change_pct=pct, **base,
    )  # fmt: skip


def _breakdown(
    columns: Sequence[str], rows: Sequence[Sequence[Cell]], m: int, base: dict[str, Any]
) -> ResultFacts:
    points = sorted(_points(rows, m, null_label=True), key=lambda p: p[1], reverse=True)
    decimals = max((_decimals(r[m]) for r in rows), default=0)
    if not points:
        return ResultFacts(kind="table", **base)
    additive = not _NOT_ADDITIVE.search(columns[m].lower()) and all(v >= 0 for _, v in points)
    total = _round(sum(v for _, v in points), decimals) if additive else None
    top = [
        FactShare(
            label=label, value=value, share=round(100.0 * value / total, 1) if total else None
        )
        for label, value in points[:TOP_K]
    ]
    return ResultFacts(
        kind="breakdown", measure=columns[m], label=columns[0], decimals=decimals, top=top,
        total=total, others=max(0, len(points) - TOP_K), **base,
    )  # fmt: skip


def _round(value: Number, decimals: int) -> Number:
    if isinstance(value, int):
        return value
    return round(value, decimals) if decimals else round(value, MAX_DECIMALS)


# -- the template sentence -------------------------------------------------------------


def fmt(value: Number | None, decimals: int = 0) -> str:
    """A number as the summary writes it: thousands separated, the rows' decimals."""
    if value is None:
        return "NULL"
    if isinstance(value, int) or (decimals == 0 and float(value).is_integer()):
        return f"{int(value):,}"
    return f"{value:,.{decimals or 2}f}"


def _pct(value: float | None, sign: bool = False) -> str:
    if value is None:
        return ""
    text = f"{value:+.1f}" if sign else f"{value:.1f}"
    return text.removesuffix(".0").replace("+-", "-") + "%"


def template_summary(facts: ResultFacts, question: str = "") -> str:
    """One factual English sentence from the facts alone (the question is not used for
    figures; it is accepted so a template may grow to echo its wording)."""
    d = facts.decimals
    note = (
        f" (the first {facts.row_count:,} rows only: the result was truncated)"
        if facts.truncated
        else ""
    )
    if facts.kind == "empty":
        return "No rows matched."
    if facts.kind == "value":
        parts = [
            f"{p.label} is {fmt(p.value, d)}" if p.value is not None else f"{p.label} is NULL"
            for p in facts.values
        ]
        return "; ".join(parts) + note + "."
    if facts.kind == "series" and facts.first and facts.last and facts.high and facts.low:
        unit = "days" if all(len(p.label) == 10 for p in (facts.first, facts.last)) else "points"
        pct = f" ({_pct(facts.change_pct, sign=True)})" if facts.change_pct is not None else ""
        text = (
            f"{facts.measure} over {facts.row_count:,} {unit}: from {fmt(facts.first.value, d)} "
            f"on {facts.first.label} to {fmt(facts.last.value, d)} on {facts.last.label}{pct}; "
            f"highest {fmt(facts.high.value, d)} on {facts.high.label}, "
            f"lowest {fmt(facts.low.value, d)} on {facts.low.label}"
        )
        return text + note + "."
    if facts.kind == "breakdown" and facts.top:

        def one(s: FactShare) -> str:
            if s.share is None:
                return f"{s.label} {fmt(s.value, d)}"
            return f"{s.label} {_pct(s.share)} ({fmt(s.value, d)})"

        head, rest = facts.top[0], facts.top[1:]
        text = f"Top {facts.label} by {facts.measure}: {one(head)}"
        if facts.total is not None:
            text += f" of {fmt(facts.total, d)}"
        if rest:
            text += "; then " + ", ".join(one(s) for s in rest)
        if facts.others:
            text += f"; {facts.others:,} more"
        return text + note + "."
    rows = "1 row" if facts.row_count == 1 else f"{facts.row_count:,} rows"
    return f"{rows} of {', '.join(facts.columns[:8])}{note}."


def facts_text(facts: ResultFacts) -> str:
    """The facts as lines for a model prompt (figures only, never the rows)."""
    return facts.model_dump_json(exclude_defaults=True)


# -- the grounding check ---------------------------------------------------------------

_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
    )
}
_ISO = re.compile(r"\b(\d{4})-(\d{2})(?:-(\d{2}))?(?:[T ]\d{2}:\d{2}(?::\d{2})?)?\b")
_MONTH_DAY = re.compile(
    r"\b(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?\s+(\d{1,2})(?:st|nd|rd|th)?"
    r"(?:,?\s+(\d{4}))?\b|\b(\d{1,2})(?:st|nd|rd|th)?\s+"
    r"(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?(?:,?\s+(\d{4}))?\b",
    re.IGNORECASE,
)
_NUM = re.compile(r"(?<![\w.,])([-+]?)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(\s?%)?(?![\w])")
_WORD = re.compile(r"[A-Za-z][\w-]*")
_IGNORED_WORDS = {
    "i", "a", "the", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday",
    "sunday", "january", "february", "march", "april", "june", "july", "august",
    "september", "october", "november", "december", "null", "sql",
}  # fmt: skip


def _fact_numbers(facts: ResultFacts) -> tuple[set[float], set[float]]:
    """(figures, percents) the facts state."""
    nums: set[float] = set()
    pcts: set[float] = set()
    if facts.kind in ("table", "series", "breakdown") or facts.truncated:
        nums.add(float(facts.row_count))
    for p in [*facts.values, facts.first, facts.last, facts.low, facts.high]:
        if p is not None and p.value is not None:
            nums.add(float(p.value))
        if p is not None and re.fullmatch(r"-?\d+(\.\d+)?", p.label):  # a year, an hour
            nums.add(float(p.label))
    for s in facts.top:
        nums.add(float(s.value))
        if s.share is not None:
            pcts.add(s.share)
    for v in (facts.change, facts.total):
        if v is not None:
            nums.add(float(v))
            nums.add(abs(float(v)))
    if facts.change_pct is not None:
        pcts.update({facts.change_pct, abs(facts.change_pct)})
    if facts.top:
        nums.add(float(len(facts.top)))
    if facts.others:
        nums.add(float(facts.others))
    return nums, pcts


def _dates(facts: ResultFacts) -> set[str]:
    found = set()
    for p in (facts.first, facts.last, facts.low, facts.high):
        if p is not None and _ISO.match(p.label):
            found.add(p.label[:10])
    return found


def _matches(stated: float, decimals: int, known: set[float]) -> bool:
    """Equal, or a known figure rounded to the stated precision (1,203.4 said as 1,203)."""
    for k in known:
        if math.isclose(stated, k, rel_tol=1e-9, abs_tol=1e-9):
            return True
        if math.isclose(round(k, decimals), stated, abs_tol=10 ** -(decimals + 2)):
            return True
    return False


def _words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z0-9][\w-]*", text)} | {
        p for w in re.findall(r"[A-Za-z0-9][\w-]*", text) for p in w.lower().split("_")
    }


def ungrounded(summary: str, facts: ResultFacts, question: str = "") -> list[str]:
    """What `summary` states that is neither among the facts nor in the question:
    numbers (formatting aside: 1,203 = 1203 = 1203.0; a percent rounded to the
    stated precision), dates (ISO or month-and-day) and capitalised names that are not
    the facts' labels, columns or words of the question."""
    bad: list[str] = []
    nums, pcts = _fact_numbers(facts)
    q_nums = {
        float(m.group(2).replace(",", "") + (m.group(3) or "")) for m in _NUM.finditer(question)
    }
    dates = _dates(facts) | {m.group(0)[:10] for m in _ISO.finditer(question)}
    text = summary
    for m in list(_ISO.finditer(text)):
        day = m.group(0)[:10] if m.group(3) else m.group(0)[:7]
        if not any(d.startswith(day) for d in dates):
            bad.append(m.group(0))
    text = _ISO.sub(" ", text)
    month_days = {(int(d[5:7]), int(d[8:10])) for d in dates if len(d) >= 10}
    years = {int(d[:4]) for d in dates}
    for m in list(_MONTH_DAY.finditer(text)):
        month = _MONTHS[(m.group(1) or m.group(5)).lower()[:3]]
        mday = int(m.group(2) or m.group(4))
        year = m.group(3) or m.group(6)
        if (month, mday) not in month_days or (year and int(year) not in years):
            bad.append(m.group(0))
    text = _MONTH_DAY.sub(" ", text)
    for m in _NUM.finditer(text):
        sign, whole, frac, pct = m.groups()
        value = float(whole.replace(",", "") + (frac or "")) * (-1 if sign == "-" else 1)
        decimals = len(frac) - 1 if frac else 0
        if pct:
            if not (_matches(value, decimals, pcts) or value in q_nums):
                bad.append(m.group(0).strip())
        elif not (_matches(value, decimals, nums) or value in q_nums or value in years):
            bad.append(m.group(0).strip())
    bad.extend(_unknown_names(text, facts, question))
    return bad


def _unknown_names(text: str, facts: ResultFacts, question: str) -> list[str]:
    """Capitalised words inside a sentence (not its first word) that are not among the
    facts' labels, the columns or the question's words: names from nowhere."""
    known = _words(question) | _IGNORED_WORDS
    for name in [*facts.columns, facts.measure or "", facts.label or ""]:
        known |= _words(name)
    for p in [*facts.values, *facts.top, facts.first, facts.last, facts.low, facts.high]:
        if p is not None:
            known |= _words(p.label)
    bad = []
    for sentence in re.split(r"(?<=[.!?;:])\s+", text):
        words = list(_WORD.finditer(sentence))
        for m in words[1:]:
            word = m.group(0)
            lower = word.lower()
            # A hyphenated name is known whole (a label "ACME-S4") or part by part.
            parts = lower.split("-")
            if word[0].isupper() and lower not in known and not all(p in known for p in parts):
                bad.append(word)
    return bad
