"""The EXPLAIN gate: judge a plan before the statement runs.

Refused: a full scan of a large table (`type=ALL`; `index`, every index entry; or
a lookup on the tenant key alone, every row of the tenant's view); an estimated number of rows
examined over the cap (rows of the tables joined in one SELECT multiply, as in
a nested-loop join; SELECTs add up); a filesort or temporary table over a
large input. The refusal carries the plan, so the generator can retry with a
pre-aggregated table or a tighter filter.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from switchyard.sqlguard import rules

PLAN_KEYS = ("id", "select_type", "table", "type", "key", "key_len", "ref", "rows", "extra")
# Index bytes of `tenant_id VARCHAR(64)` in utf8mb4 (64 x 4 + 2 length bytes): an index
# lookup that uses exactly this much of the key is the view's own tenant filter and
# nothing else, i.e. it reads every row of the tenant's view.
TENANT_KEY_LEN = "258"


@dataclass(frozen=True)
class GateLimits:
    max_rows: int
    large_table_rows: int


@dataclass
class GateVerdict:
    ok: bool
    rule: str | None = None
    detail: str | None = None
    rows_estimated: int = 0
    plan: list[dict[str, Any]] = field(default_factory=list)


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _full_scan(row: dict[str, Any]) -> str | None:
    kind = str(row.get("type", "")).upper()
    if kind == "ALL":
        return "every row of the table"
    if kind == "INDEX":
        return "every entry of an index"
    if kind == "REF" and row.get("key_len") == TENANT_KEY_LEN and row.get("ref") == "const":
        return "every row of the tenant's view"
    return None


def summarize(plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plan columns worth showing a generator or an auditor, JSON-safe."""
    out = []
    for row in plan[:64]:
        item: dict[str, Any] = {}
        for key in PLAN_KEYS:
            value = row.get(key)
            if key == "rows":
                item[key] = _int(value)
            elif value is not None:
                item[key] = str(value)[:200]
        out.append(item)
    return out


def judge(plan: list[dict[str, Any]], limits: GateLimits) -> GateVerdict:
    summary = summarize(plan)
    per_select: dict[str, float] = defaultdict(lambda: 1.0)
    for row in summary:
        per_select[str(row.get("id"))] *= max(1, row.get("rows", 0))
    estimated = sum(per_select.values()) if summary else 0.0
    rows_estimated = int(min(estimated, 2**62)) if math.isfinite(estimated) else 2**62
    verdict = GateVerdict(ok=True, rows_estimated=rows_estimated, plan=summary)
    for row in summary:
        rows = row.get("rows", 0)
        what = _full_scan(row)
        if what and rows >= limits.large_table_rows:
            verdict.ok, verdict.rule = False, rules.EXPLAIN_FULL_SCAN
            verdict.detail = (
                f"full scan of {row.get('table')} ({what}, ~{rows} rows; the cap for a full "
                f"scan is {limits.large_table_rows}); filter on an indexed column such as a "
                "date range, or use a pre-aggregated agg_* table"
            )
            return verdict
    if rows_estimated > limits.max_rows:
        verdict.ok, verdict.rule = False, rules.EXPLAIN_ROWS
        verdict.detail = (
            f"the plan examines ~{rows_estimated} rows, over the cap of {limits.max_rows}; "
            "narrow the filter or use a pre-aggregated agg_* table"
        )
        return verdict
    for row in summary:
        extra = str(row.get("extra", ""))
        if ("filesort" in extra or "temporary" in extra) and per_select[
            str(row.get("id"))
        ] >= limits.large_table_rows:
            verdict.ok, verdict.rule = False, rules.EXPLAIN_SORT
            verdict.detail = (
                f"sorting or a temporary table over ~{int(per_select[str(row.get('id'))])} rows "
                f"of {row.get('table')}; aggregate less or use a pre-aggregated table"
            )
            return verdict
    return verdict
