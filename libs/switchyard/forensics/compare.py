"""Comparing replayed results with the recorded ones: the diff report of `sy replay`.

Per request: the status; the routing decision (pool, partition and the worker that
owned it; for a SQL question, those of each of its model calls); the output when the
request ran at temperature 0 (a generation's text; a question's SQL, columns and rows);
and the end-to-end time, which is reported (medians and p99 side by side) but never
called a difference — timings differ between any two runs.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import dataclass, field
from typing import Any

from switchyard.bench.stats import percentile
from switchyard.forensics.replay import Collected, Outcome, Sent, temperature
from switchyard.messages.inference import GenerateResult
from switchyard.messages.sql import SqlAnswer
from switchyard.tracing import trace_id


@dataclass(frozen=True)
class Difference:
    original_id: str
    replay_id: str
    what: str  # status | routing | output | missing
    recorded: Any
    replayed: Any


@dataclass
class DiffReport:
    requests: int = 0
    answered: int = 0
    routing_compared: int = 0
    routing_same: int = 0
    outputs_compared: int = 0
    outputs_same: int = 0
    recorded_seconds: list[float] = field(default_factory=list)
    replayed_seconds: list[float] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    ids: dict[str, str] = field(default_factory=dict)  # original -> replay

    @property
    def identical(self) -> bool:
        return not self.differences and self.answered == self.requests

    def verdict(self) -> str:
        if self.identical:
            return (
                f"reproduced: {self.routing_same}/{self.routing_compared} routing decisions and "
                f"{self.outputs_same}/{self.outputs_compared} temperature-0 outputs identical"
            )
        return (
            f"{len(self.differences)} difference(s): routing {self.routing_same}/"
            f"{self.routing_compared} same, outputs {self.outputs_same}/{self.outputs_compared}"
            f" same, {self.requests - self.answered} of {self.requests} unanswered"
        )

    def timing(self) -> dict[str, float | None]:
        def stat(xs: list[float], q: float | None = None) -> float | None:
            if not xs:
                return None
            return statistics.median(xs) if q is None else percentile(xs, q)

        rec, rep = stat(self.recorded_seconds), stat(self.replayed_seconds)
        return {
            "recorded_p50": rec,
            "replayed_p50": rep,
            "recorded_p99": stat(self.recorded_seconds, 0.99),
            "replayed_p99": stat(self.replayed_seconds, 0.99),
            "p50_ratio": rep / rec if rec and rep is not None else None,
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict(),
            "identical": self.identical,
            "requests": self.requests,
            "answered": self.answered,
            "routing": {"compared": self.routing_compared, "same": self.routing_same},
            "outputs": {"compared": self.outputs_compared, "same": self.outputs_same},
            "timing": self.timing(),
            "differences": [d.__dict__ for d in self.differences],
            "ids": self.ids,
        }


def routing(outcome: Outcome, calls: list[GenerateResult]) -> list[tuple[Any, ...]]:
    """The routing decisions behind an outcome: its own, or its model calls' in order."""
    results = [outcome] if isinstance(outcome, GenerateResult) else calls
    decisions = []
    for r in sorted(results, key=lambda r: r.created_at):
        route = r.route
        decisions.append(
            ("refused", r.status) if route is None or route.partition is None
            else (route.pool, route.partition, route.routed_to)
        )  # fmt: skip
    return decisions


def output(outcome: Outcome) -> Any:
    """What a temperature-0 run must reproduce exactly."""
    if isinstance(outcome, GenerateResult):
        return outcome.text
    rows = hashlib.sha256(json.dumps(outcome.rows, default=str).encode()).hexdigest()[:16]
    return {"sql": outcome.sql, "columns": outcome.columns, "rows": len(outcome.rows),
            "rows_sha": rows, "path": outcome.path}  # fmt: skip


def seconds(outcome: Outcome) -> float | None:
    if isinstance(outcome, SqlAnswer):
        return outcome.duration
    route = outcome.route
    return None if route is None else route.finished_at - route.created_at


def _calls(collected: Collected, outcome: Outcome) -> list[GenerateResult]:
    if not isinstance(outcome, SqlAnswer):
        return []
    tid = trace_id(outcome.trace)
    return [c for c in collected.calls.get(tid or "", []) if c.request_id != outcome.request_id]


def compare(sent: list[Sent], recorded: Collected, replayed: Collected) -> DiffReport:
    report = DiffReport(requests=len(sent))
    for item in sent:
        oid, rid = item.original.message.id, item.replay.id
        report.ids[oid] = rid
        before, after = recorded.outcomes.get(oid), replayed.outcomes.get(rid)
        if after is not None:
            report.answered += 1
        if before is None or after is None:
            report.differences.append(
                Difference(oid, rid, "missing", before is not None, after is not None)
            )
            continue
        if (s := seconds(before)) is not None:
            report.recorded_seconds.append(s)
        if (s := seconds(after)) is not None:
            report.replayed_seconds.append(s)
        if before.status != after.status:
            report.differences.append(Difference(oid, rid, "status", before.status, after.status))
        was = routing(before, _calls(recorded, before))
        now = routing(after, _calls(replayed, after))
        report.routing_compared += 1
        if was == now:
            report.routing_same += 1
        else:
            report.differences.append(Difference(oid, rid, "routing", was, now))
        if temperature(item.original.message) == 0.0:
            report.outputs_compared += 1
            if output(before) == output(after):
                report.outputs_same += 1
            else:
                report.differences.append(
                    Difference(oid, rid, "output", output(before), output(after))
                )
    return report
