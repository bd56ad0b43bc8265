"""Database values as message cells (str, int, float, bool or None)."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

Cell = str | int | float | bool | None


def to_cell(value: Any) -> Cell:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, set | frozenset):
        return ",".join(sorted(str(v) for v in value))
    return str(value)


def cell_size(cell: Cell) -> int:
    """Approximate encoded bytes, for the result byte cap."""
    if isinstance(cell, str):
        return len(cell.encode("utf-8")) + 5
    return 9
