"""A Vega-Lite chart chosen from a result's shape: data and a declarative spec, never code.

The choice is deterministic (the same columns and values give the same chart), so
a client can render it without trusting anything a model wrote:

- a time-like first column and numeric columns: a line per numeric column;
- one category and one number: bars;
- two categories and one number: stacked bars coloured by the second category;
- anything else (a single value, a wide table, no rows): no chart.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Any

from switchyard.messages.sql import Cell

SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"
MAX_POINTS = 500  # a chart of more points is not read, it is scrolled
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?$")


def _is_number(value: Cell) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    if isinstance(value, str):
        try:
            float(value)  # DECIMAL arrives as text to keep its precision
        except ValueError:
            return False
        return True
    return False


def _is_time(value: Cell) -> bool:
    return (isinstance(value, str) and bool(_DATE.match(value))) or isinstance(value, dt.date)


def _kinds(rows: Sequence[Sequence[Cell]], width: int) -> list[str]:
    kinds = []
    for i in range(width):
        values = [r[i] for r in rows if r[i] is not None]
        if values and all(_is_time(v) for v in values):
            kinds.append("temporal")
        elif values and all(_is_number(v) for v in values):
            kinds.append("quantitative")
        else:
            kinds.append("nominal")
    return kinds


def _value(cell: Cell) -> Any:
    return float(cell) if isinstance(cell, str) and _is_number(cell) else cell


def chart_for(columns: Sequence[str], rows: Sequence[Sequence[Cell]]) -> dict[str, Any] | None:
    if len(rows) < 2 or not columns or len(rows) > MAX_POINTS:
        return None
    kinds = _kinds(rows, len(columns))
    numeric = [c for c, k in zip(columns, kinds, strict=True) if k == "quantitative"]
    values = [
        {c: _value(v) for c, v in zip(columns, row, strict=True)} for row in rows[:MAX_POINTS]
    ]
    spec: dict[str, Any] = {"$schema": SCHEMA, "data": {"values": values}}
    if kinds[0] == "temporal" and numeric:
        if len(numeric) == 1:
            enc = {"x": {"field": columns[0], "type": "temporal"},
                   "y": {"field": numeric[0], "type": "quantitative"}}  # fmt: skip
            return {**spec, "mark": "line", "encoding": enc}
        fold = {"fold": numeric, "as": ["measure", "value"]}
        enc = {"x": {"field": columns[0], "type": "temporal"},
               "y": {"field": "value", "type": "quantitative"},
               "color": {"field": "measure", "type": "nominal"}}  # fmt: skip
        return {**spec, "transform": [fold], "mark": "line", "encoding": enc}
    nominal = [c for c, k in zip(columns, kinds, strict=True) if k != "quantitative"]
    if len(columns) == 2 and len(nominal) == 1 and len(numeric) == 1:
        enc = {"x": {"field": nominal[0], "type": "nominal", "sort": "-y"},
               "y": {"field": numeric[0], "type": "quantitative"}}  # fmt: skip
        return {**spec, "mark": "bar", "encoding": enc}
    if len(columns) == 3 and len(nominal) == 2 and len(numeric) == 1:
        enc = {"x": {"field": nominal[0], "type": "nominal"},
               "y": {"field": numeric[0], "type": "quantitative"},
               "color": {"field": nominal[1], "type": "nominal"}}  # fmt: skip
        return {**spec, "mark": "bar", "encoding": enc}
    return None
