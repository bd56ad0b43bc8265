"""One EXPLAIN and one executor decision per executed statement, through sqlflow on a
real NATS and MariaDB: the pipeline asks the executor once, and the gate's plan and
refusal come back on that one reply (no model: verified questions only)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from switchyard import subjects
from switchyard.bus import rpc
from switchyard.bus.connection import Bus
from switchyard.codec import decode
from switchyard.messages.sql import AuditEvent, ExecuteReply, SqlAnswer, StageEvent
from switchyard.sqldb import executor as executor_module
from switchyard.sqldb import runner
from switchyard.text2sql.knowledge import KnowledgeStore
from switchyard.text2sql.pipeline import NOT_GENERATED
from switchyard.tracing import new_traceparent
from tests.support.fleet import provision_pool
from tests.support.sqlask import ask_question
from tests.support.sqlenv import SqlEnv
from tests.support.sqlflow import KNOWLEDGE, sqlflow_in_process
from tests.support.sqlservices import sql_services

PRODUCTION_GATE = {"sql_explain_max_rows": 50_000, "sql_explain_large_table_rows": 20_000}
REFUSE_EVERY_PLAN = {"sql_explain_max_rows": 1, "sql_explain_large_table_rows": 1}


@pytest.fixture
def explains(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every EXPLAIN the executor sends to MariaDB (the real call, counted)."""
    sent: list[str] = []
    real = runner.explain

    async def counted(conn: Any, sql: str, timeout: float) -> list[dict[str, Any]]:
        sent.append(sql)
        return await real(conn, sql, timeout)

    monkeypatch.setattr(executor_module, "explain", counted)
    return sent


@contextlib.asynccontextmanager
async def verified_only(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, index: Path, gate: dict[str, Any]
) -> AsyncIterator[None]:
    """The validator, the executor (with `gate`) and sqlflow: no router, no model."""
    await provision_pool(bus.js, "sql")  # the shared streams, INGRESS, RES and AUDIT
    async with (
        sql_services(nats_url, sqlenv, **gate),
        sqlflow_in_process(nats_url, sqlenv, index, generation=False, summary=False),
    ):  # fmt: skip
        yield


async def executor_rows(bus: Bus, tenant: str, trace: str, timeout: float = 10) -> list[AuditEvent]:
    """The executor's audit rows of one question (its trace), read until the answer's."""
    found: list[AuditEvent] = []
    sub = await bus.js.subscribe(subjects.audit("sql", tenant), ordered_consumer=True)
    deadline = time.monotonic() + timeout
    try:
        while True:
            msg = await sub.next_msg(timeout=max(0.01, deadline - time.monotonic()))
            event = decode(msg.data, AuditEvent)
            if event.trace != trace:
                continue
            if event.event == "sql.answer":
                return found
            if event.actor == "executor":
                found.append(event)
    finally:
        await sub.unsubscribe()


async def ask(bus: Bus, question: str, trace: str) -> tuple[list[StageEvent], SqlAnswer]:
    return await ask_question(bus, "acme", question, trace=trace, no_cache=True)


async def test_an_executed_question_costs_one_explain_and_one_audit_row(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, tmp_path: Path, explains: list[str],
) -> None:  # fmt: skip
    verified = KnowledgeStore(KNOWLEDGE).load("acme").verified[0]
    async with verified_only(bus, nats_url, sqlenv, tmp_path / "index", PRODUCTION_GATE):
        for _ in range(2):  # no_cache: the second is executed again, not a cached result
            trace = new_traceparent()
            before = len(explains)
            events, answer = await ask(bus, verified.question, trace)
            assert (answer.status, answer.path) == ("ok", "verified"), answer
            rows = await executor_rows(bus, "acme", trace)
            assert len(explains) - before == 1, explains[before:]
            assert [(r.event, r.verdict) for r in rows] == [("sql.execute", "ok")]
            (explain,) = [e for e in events if e.stage == "explain"]
            (ran,) = [e for e in events if e.stage == "rows"]
            assert explain.data["ok"] and explain.data["rule"] is None
            assert explain.data["plan"] == rows[0].plan[:8] and explain.data["plan"]
            assert explain.data["rows_estimated"] == rows[0].detail["rows_estimated"]
            assert ran.data["ok"] and ran.data["count"] == len(answer.rows) > 0


async def test_a_refused_plan_is_told_as_before_with_one_explain(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, tmp_path: Path, explains: list[str],
) -> None:  # fmt: skip
    """The gate refuses: the asker sees the "explain" stage with the gate's rule, plan and
    estimate (what the executor says of that statement), no rows stage, and the same
    answer as before (a verified query refused now falls through to the clarification)."""
    verified = KnowledgeStore(KNOWLEDGE).load("acme").verified[0]
    trace = new_traceparent()
    async with verified_only(bus, nats_url, sqlenv, tmp_path / "index", REFUSE_EVERY_PLAN):
        events, answer = await ask(bus, verified.question, trace)
        rows = await executor_rows(bus, "acme", trace)
        assert len(explains) == 1, explains
        direct = await rpc.request(
            bus.nc, subjects.SQL_EXECUTE, sqlenv.signed("acme", verified.sql, gate=True),
            ExecuteReply, timeout=15,
        )  # fmt: skip
    assert not direct.ok and not direct.gate_passed and direct.rule
    assert direct.rule.startswith("explain.") and direct.error
    assert direct.error.code == "rejected_sql"
    (explain,) = [e for e in events if e.stage == "explain"]
    assert explain.data == {"ok": False, "rule": direct.rule, "plan": direct.plan[:8],
                            "rows_estimated": direct.rows_estimated}  # fmt: skip
    assert "rows" not in [e.stage for e in events]
    assert [(r.event, r.verdict, r.rule) for r in rows] == [
        ("sql.execute", "rejected", direct.rule)
    ]
    assert (answer.status, answer.path) == ("clarify", "clarify"), answer
    assert answer.error and answer.error.reason == NOT_GENERATED
