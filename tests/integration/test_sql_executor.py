"""The executor's core on the real MariaDB: signatures, re-validation, the EXPLAIN gate,
runaway queries, the pool, caps. (Over NATS: test_sql_services.py.)"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import pymysql
import pytest

from switchyard.codec import encode
from switchyard.messages.sql import ExecuteRequest
from switchyard.sqldb import executor as executor_module
from switchyard.sqldb.executor import SqlExecutor
from switchyard.sqlguard import rules
from switchyard.sqlguard.signing import sign
from tests.support.sqlenv import SqlEnv

# Same question, raw table vs pre-aggregated table.
RAW_DAU = ("SELECT day, COUNT(*) AS dau FROM daily_activity WHERE day >= '2025-01-11' "
           "GROUP BY day ORDER BY day")  # fmt: skip
AGG_DAU = ("SELECT day, SUM(dau) AS dau FROM agg_dau_daily WHERE day >= '2025-01-11' "
           "GROUP BY day ORDER BY day")  # fmt: skip
FULL_SCAN = "SELECT COUNT(*) FROM sessions WHERE duration_s > 600"
RUNAWAY = ("SELECT COUNT(*) FROM sessions a CROSS JOIN sessions b "
           "WHERE a.duration_s + b.duration_s > 100000")  # fmt: skip


@pytest.fixture
async def executor(sqlenv: SqlEnv) -> AsyncIterator[SqlExecutor]:
    ex = SqlExecutor(sqlenv.settings())
    yield ex
    ex.close()


def make(sqlenv: SqlEnv, **overrides: Any) -> SqlExecutor:
    return SqlExecutor(sqlenv.settings(**overrides))


async def test_round_trip_returns_the_tenants_rows_and_audits_no_rows(
    executor: SqlExecutor, sqlenv: SqlEnv
) -> None:
    req = sqlenv.signed("acme", "SELECT nickname, level FROM players ORDER BY player_id LIMIT 5")
    decision = await executor.handle(req)
    reply, audit = decision.reply, decision.audit
    assert reply.ok and reply.error is None, reply.error
    assert reply.columns == ["nickname", "level"] and len(reply.rows) == 5
    assert all(str(r[0]).startswith("acme_player_") for r in reply.rows)
    assert reply.rows_examined is not None and reply.rows_examined >= 5
    assert reply.plan and reply.rows_estimated is not None  # the gate looked at it
    assert audit.verdict == "ok" and audit.rows_returned == 5 and audit.sql == req.canonical_sql
    assert audit.sql_hash and not audit.killed and audit.rows_scanned == reply.rows_examined
    wire = encode(audit)
    for row in reply.rows:
        assert str(row[0]).encode() not in wire  # never result rows in the audit trail


async def test_unsigned_foreign_and_altered_sql_are_refused(
    executor: SqlExecutor, sqlenv: SqlEnv
) -> None:
    good = sqlenv.signed("acme", "SELECT nickname FROM players LIMIT 3")
    cases = {
        rules.SIGNATURE_MISSING: good.model_copy(update={"signature": None}),
        # signed for nova, presented as acme's
        rules.SIGNATURE_INVALID: sqlenv.signed(
            "nova", "SELECT nickname FROM players LIMIT 3"
        ).model_copy(update={"tenant": "acme", "database": good.database}),
        # altered after signing
        "altered": good.model_copy(
            update={"canonical_sql": good.canonical_sql.replace("LIMIT 3", "LIMIT 1000")}
        ),
        "other-table": good.model_copy(
            update={"canonical_sql": good.canonical_sql.replace("acme", "nova")}
        ),
        "bad-version": good.model_copy(update={"policy_version": "v-other"}),
    }
    for name, req in cases.items():
        decision = await executor.handle(req)
        assert not decision.reply.ok, name
        assert decision.reply.rows == []
        expected = (
            rules.SIGNATURE_MISSING
            if name == rules.SIGNATURE_MISSING
            else (rules.SIGNATURE_INVALID)
        )
        assert decision.reply.rule == expected, (name, decision.reply.rule)
        assert decision.reply.error is not None and decision.reply.error.code == "unauthorized"
        assert decision.audit.verdict == "rejected" and decision.audit.rule == expected


async def test_validly_signed_but_not_acceptable_now_is_refused(
    executor: SqlExecutor, sqlenv: SqlEnv
) -> None:
    """A correct signature is necessary, not sufficient: the executor validates again."""
    policy = sqlenv.policies().get("acme")
    assert policy is not None and policy.database
    key = sqlenv.signing_key.encode()

    def forged(sql: str, version: str = policy.policy_version) -> ExecuteRequest:
        signature = sign(key, tenant="acme", database=policy.database or "", sql=sql,
                         policy_version=version)  # fmt: skip
        return ExecuteRequest(tenant="acme", canonical_sql=sql, database=policy.database or "",
                              policy_version=version, signature=signature)  # fmt: skip

    nova = sqlenv.schema("nova")
    refused = await executor.handle(forged(f"SELECT nickname FROM {nova}.players LIMIT 1"))
    assert refused.reply.rule == rules.REVALIDATION_FAILED
    assert "table.not_allowed" in (refused.reply.error.reason if refused.reply.error else "")
    changed = await executor.handle(forged(f"select nickname from {sqlenv.schema('acme')}.players"))
    assert changed.reply.rule == rules.REVALIDATION_CHANGED  # not canonical: not run
    stale = await executor.handle(forged("SELECT 1 LIMIT 1", version="sqlguard-1-old"))
    assert stale.reply.rule == rules.POLICY_STALE


async def test_explain_gate_refuses_a_full_scan_and_accepts_the_aggregate(
    executor: SqlExecutor, sqlenv: SqlEnv
) -> None:
    full = await executor.handle(sqlenv.signed("acme", FULL_SCAN))
    assert not full.reply.ok and full.reply.rows == []
    assert full.reply.rule == rules.EXPLAIN_FULL_SCAN and not full.reply.gate_passed
    # MariaDB reads every row of the tenant's view: the whole table (type=ALL) or the
    # whole tenant prefix of an index (type=ref on the tenant key alone).
    (scan,) = [p for p in full.reply.plan if p.get("table") == "sessions"]
    assert scan["rows"] > 5_000 and scan["type"] in ("ALL", "ref")
    assert full.audit.plan == full.reply.plan and full.audit.verdict == "rejected"

    raw = await executor.handle(sqlenv.signed("acme", RAW_DAU))
    assert not raw.reply.ok and raw.reply.rule in (rules.EXPLAIN_ROWS, rules.EXPLAIN_FULL_SCAN)
    assert raw.reply.rows_estimated and raw.reply.rows_estimated > 5_000
    assert "agg_" in (raw.reply.error.reason if raw.reply.error else "")  # a hint to retry with

    agg = await executor.handle(sqlenv.signed("acme", AGG_DAU))
    assert agg.reply.ok and agg.reply.gate_passed, agg.reply.error
    assert len(agg.reply.rows) == 30
    assert agg.reply.rows_estimated is not None and agg.reply.rows_estimated < 5_000


async def test_same_answer_raw_and_aggregated_and_raw_is_measurably_slower(
    sqlenv: SqlEnv,
) -> None:
    ungated = make(sqlenv, sql_explain_gate=False)
    try:
        times: dict[str, list[float]] = {"raw": [], "agg": []}
        answers: dict[str, Any] = {}
        examined: dict[str, int] = {}
        for _ in range(7):
            for name, sql in (("raw", RAW_DAU), ("agg", AGG_DAU)):
                decision = await ungated.handle(sqlenv.signed("acme", sql))
                assert decision.reply.ok, decision.reply.error
                assert decision.reply.db_duration is not None
                times[name].append(decision.reply.db_duration)
                examined[name] = decision.reply.rows_examined or 0
                answers[name] = decision.reply.rows
        assert answers["raw"] == answers["agg"]
        raw, agg = statistics.median(times["raw"]), statistics.median(times["agg"])
        # Interleaved medians; 1.5x leaves room for a noisy shared machine.
        assert raw > 1.5 * agg, (raw, agg)
        assert examined["raw"] > 5 * examined["agg"], examined
    finally:
        ungated.close()


async def test_a_request_adds_the_gate_where_it_is_off_and_the_reply_carries_its_verdict(
    sqlenv: SqlEnv,
) -> None:
    """`gate=True` (the pipeline's) is gated on an executor whose gate is off; the reply
    says whether the gate passed the plan, and the one audit row is the execute's."""
    ungated = make(sqlenv, sql_explain_gate=False)
    try:
        plain = await ungated.handle(sqlenv.signed("acme", FULL_SCAN))
        assert plain.reply.ok and not plain.reply.gate_passed and plain.reply.plan == []
        refused = await ungated.handle(sqlenv.signed("acme", FULL_SCAN, gate=True))
        assert not refused.reply.ok and not refused.reply.gate_passed
        assert refused.reply.rule == rules.EXPLAIN_FULL_SCAN and refused.reply.plan
        assert refused.audit.event == "sql.execute" and refused.audit.verdict == "rejected"
        passed = await ungated.handle(sqlenv.signed("acme", AGG_DAU, gate=True))
        assert passed.reply.ok and passed.reply.gate_passed and len(passed.reply.rows) == 30
        assert passed.reply.plan and passed.reply.rows_estimated is not None
        assert passed.audit.event == "sql.execute" and passed.audit.plan == passed.reply.plan
    finally:
        ungated.close()


async def test_runaway_query_is_killed_by_the_server_limit_and_the_connection_reused(
    sqlenv: SqlEnv,
) -> None:
    ex = make(sqlenv, sql_explain_gate=False, sql_statement_timeout=1.0, sql_pool_size=1)
    try:
        started = time.monotonic()
        decision = await ex.handle(sqlenv.signed("acme", RUNAWAY))
        elapsed = time.monotonic() - started
        assert decision.reply.killed and decision.reply.kill_reason == "server_timeout"
        assert decision.reply.rule == rules.EXEC_KILLED and decision.audit.killed
        assert decision.audit.verdict == "killed"
        assert elapsed < 1.0 + 1.0, elapsed  # deadline + 1 s
        pool = ex.pool("acme")
        thread = pool._idle[0].thread_id  # the same connection, back in the pool
        after = await ex.handle(sqlenv.signed("acme", "SELECT COUNT(*) FROM servers"))
        assert after.reply.ok and after.reply.rows == [[8]]
        assert pool._idle[0].thread_id == thread
    finally:
        ex.close()


async def test_runaway_query_is_killed_by_the_watchdog_when_the_server_limit_is_off(
    sqlenv: SqlEnv,
) -> None:
    ex = make(sqlenv, sql_explain_gate=False, sql_statement_timeout=1.0, sql_pool_size=1,
              sql_server_timeout=False)  # fmt: skip
    try:
        started = time.monotonic()
        decision = await ex.handle(sqlenv.signed("acme", RUNAWAY))
        elapsed = time.monotonic() - started
        assert decision.reply.killed and decision.reply.kill_reason == "watchdog", decision.reply
        assert decision.audit.killed and decision.audit.detail["kill_reason"] == "watchdog"
        assert elapsed < 1.0 + 1.0, elapsed
        after = await ex.handle(sqlenv.signed("acme", "SELECT COUNT(*) FROM regions"))
        assert after.reply.ok and after.reply.rows == [[5]]
    finally:
        ex.close()


async def test_deadline_from_the_request_bounds_the_statement(sqlenv: SqlEnv) -> None:
    ex = make(sqlenv, sql_explain_gate=False, sql_statement_timeout=30.0)
    try:
        started = time.monotonic()
        req = sqlenv.signed("acme", RUNAWAY, deadline=time.time() + 0.8)
        decision = await ex.handle(req)
        assert decision.reply.killed and time.monotonic() - started < 0.8 + 1.0
        late = sqlenv.signed("acme", "SELECT 1", deadline=time.time() - 1)
        assert (await ex.handle(late)).reply.rule == rules.EXEC_EXPIRED
    finally:
        ex.close()


async def test_pool_exhaustion_answers_busy_fast(sqlenv: SqlEnv) -> None:
    ex = make(sqlenv, sql_explain_gate=False, sql_statement_timeout=1.5, sql_pool_size=2,
              sql_busy_timeout=0.05)  # fmt: skip
    try:
        hogs = [asyncio.create_task(ex.handle(sqlenv.signed("acme", RUNAWAY))) for _ in range(2)]
        await asyncio.sleep(0.4)  # both hold their connection now
        started = time.monotonic()
        busy = await ex.handle(sqlenv.signed("acme", "SELECT 1"))
        waited = time.monotonic() - started
        assert busy.reply.rule == rules.POOL_BUSY and busy.audit.verdict == "busy"
        assert busy.reply.error is not None and busy.reply.error.code == "no_capacity"
        assert waited < 0.3, waited
        for hog in await asyncio.gather(*hogs):
            assert hog.reply.killed
        assert (await ex.handle(sqlenv.signed("acme", "SELECT 1"))).reply.ok  # capacity is back
    finally:
        ex.close()


async def test_row_and_byte_caps_truncate(sqlenv: SqlEnv) -> None:
    ex = make(sqlenv, sql_max_rows=10)
    try:
        req = sqlenv.signed("acme", "SELECT nickname FROM players ORDER BY player_id LIMIT 50")
        decision = await ex.handle(req)
        assert decision.reply.ok and len(decision.reply.rows) == 10 and decision.reply.truncated
        assert decision.audit.detail["truncated"] is True
    finally:
        ex.close()
    ex = make(sqlenv, sql_max_bytes=2048)
    wide = sqlenv.signed("acme", "SELECT nickname, channel, country, device, registered_on "
                                 "FROM players ORDER BY player_id LIMIT 50")  # fmt: skip
    try:
        decision = await ex.handle(wide)
        assert decision.reply.truncated and 0 < len(decision.reply.rows) < 50
    finally:
        ex.close()


async def test_a_database_error_is_an_answer(executor: SqlExecutor, sqlenv: SqlEnv) -> None:
    decision = await executor.handle(sqlenv.signed("acme", "SELECT (SELECT nickname FROM players)"))
    assert not decision.reply.ok and decision.reply.rule == rules.EXEC_DB_ERROR
    assert decision.reply.error is not None and "1242" in decision.reply.error.reason
    again = await executor.handle(sqlenv.signed("acme", "SELECT COUNT(*) FROM regions"))
    assert again.reply.ok  # the pool is fine afterwards


async def test_a_driver_error_mid_statement_drops_its_connection(
    executor: SqlExecutor, sqlenv: SqlEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = sqlenv.signed("acme", "SELECT COUNT(*) FROM regions")
    assert (await executor.handle(count)).reply.ok  # one idle connection in acme's pool
    pool = executor.pool("acme")
    leased = pool._idle[-1]

    async def lost(*_: object) -> None:
        raise pymysql.err.OperationalError(2013, "Lost connection to server during query")

    monkeypatch.setattr(executor_module, "run_select", lost)
    decision = await executor.handle(count)
    assert not decision.reply.ok and decision.reply.rule == rules.EXEC_DB_ERROR
    assert decision.reply.error is not None and "2013" in decision.reply.error.reason
    assert decision.audit.verdict == "error" and decision.audit.rule == rules.EXEC_DB_ERROR
    assert leased not in pool._idle and leased.closed  # dropped, never handed out again
    monkeypatch.undo()
    assert (await executor.handle(count)).reply.ok


async def test_unknown_tenant(executor: SqlExecutor, sqlenv: SqlEnv) -> None:
    req = sqlenv.signed("acme", "SELECT 1").model_copy(update={"tenant": "stranger"})
    decision = await executor.handle(req)
    assert decision.reply.rule == rules.POLICY_UNKNOWN_TENANT
