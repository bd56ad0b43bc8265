"""The validator and executor services over a real NATS and MariaDB: the round trip,
refusals, kills and busy answers, and the audit trail they leave in AUDIT."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from services.validator import service as validator_service
from switchyard import subjects
from switchyard.bus import rpc
from switchyard.bus.connection import Bus
from switchyard.codec import decode
from switchyard.errors import SwitchyardError
from switchyard.fleet.readiness import wait_for_responder
from switchyard.messages.sql import (
    AuditEvent,
    ExecuteReply,
    ExecuteRequest,
    ValidateReply,
    ValidateRequest,
)
from switchyard.sqlguard import rules
from tests.conftest import REPO
from tests.support.sqlenv import SqlEnv
from tests.support.sqlservices import sql_services

RUNAWAY = ("SELECT COUNT(*) FROM sessions a CROSS JOIN sessions b "
           "WHERE a.duration_s + b.duration_s > 100000")  # fmt: skip


async def ask_validate(bus: Bus, sqlenv: SqlEnv, sql: str, tenant: str = "acme") -> ValidateReply:
    req = ValidateRequest(tenant=tenant, sql=sql, database=sqlenv.schema(tenant),
                          question="how many players?")  # fmt: skip
    return await rpc.request(bus.nc, subjects.SQL_VALIDATE, req, ValidateReply, timeout=10)


def execute_request(reply: ValidateReply, sqlenv: SqlEnv, **kw: Any) -> ExecuteRequest:
    assert reply.ok and reply.canonical_sql and reply.policy_version, reply
    return ExecuteRequest(
        tenant=reply.tenant, canonical_sql=reply.canonical_sql,
        database=sqlenv.schema(reply.tenant), policy_version=reply.policy_version,
        signature=reply.signature, **kw,
    )  # fmt: skip


async def ask_execute(bus: Bus, req: ExecuteRequest) -> Any:
    return await rpc.request(bus.nc, subjects.SQL_EXECUTE, req, ExecuteReply, timeout=15)


async def audit_events(
    bus: Bus, tenant: str, ids: set[str], timeout: float = 5.0
) -> dict[str, tuple[AuditEvent, bytes]]:
    found: dict[str, tuple[AuditEvent, bytes]] = {}
    sub = await bus.js.subscribe(subjects.audit("sql", tenant), ordered_consumer=True)
    deadline = time.monotonic() + timeout
    try:
        while ids - found.keys():
            msg = await sub.next_msg(timeout=max(0.01, deadline - time.monotonic()))
            event = decode(msg.data, AuditEvent)
            if event.request_id in ids:
                found[event.request_id] = (event, msg.data)
    finally:
        await sub.unsubscribe()
    return found


async def test_validate_then_execute_round_trip_with_audit_and_no_rows_in_it(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, audit_stream: None
) -> None:
    async with sql_services(nats_url, sqlenv):
        sql = "select nickname, level from players order by player_id limit 5"
        validated = await ask_validate(bus, sqlenv, sql)
        assert validated.ok and validated.signature and validated.limit_action is None
        assert validated.canonical_sql == (
            f"SELECT `nickname`, `level` FROM `{sqlenv.schema('acme')}`.`players` "
            "ORDER BY `player_id` LIMIT 5"
        )
        req = execute_request(validated, sqlenv)
        result = await ask_execute(bus, req)
        assert result.ok and len(result.rows) == 5 and result.request_id == req.id
        assert all(str(r[0]).startswith("acme_player_") for r in result.rows)
        events = await audit_events(bus, "acme", {validated.request_id, req.id})
    v_event, _ = events[validated.request_id]
    assert (v_event.event, v_event.actor, v_event.verdict) == ("sql.validate", "validator", "ok")
    assert v_event.sql == sql and v_event.question == "how many players?" and v_event.sql_hash
    assert v_event.detail["canonical_sql"] == validated.canonical_sql
    e_event, raw = events[req.id]
    assert (e_event.event, e_event.verdict, e_event.rows_returned) == ("sql.execute", "ok", 5)
    assert e_event.sql == req.canonical_sql and e_event.rows_scanned and e_event.duration
    assert not e_event.killed and e_event.plan
    for row in result.rows:
        assert str(row[0]).encode() not in raw  # no result rows in the audit trail


async def test_refusals_are_answered_and_audited(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, audit_stream: None
) -> None:
    async with sql_services(nats_url, sqlenv):
        refused = await ask_validate(bus, sqlenv, f"SELECT * FROM {sqlenv.schema('nova')}.players")
        assert not refused.ok and refused.rule == rules.TABLE_NOT_ALLOWED
        assert refused.signature is None and refused.error and refused.error.code == "rejected_sql"
        assert refused.node and "players" in refused.node

        good = execute_request(await ask_validate(bus, sqlenv, "SELECT COUNT(*) FROM players"),
                               sqlenv)  # fmt: skip
        tampered = good.model_copy(
            update={"canonical_sql": good.canonical_sql.replace("COUNT(*)", "COUNT(*), 1")}
        )
        unsigned = good.model_copy(update={"signature": None, "id": good.id + "u"})
        other = good.model_copy(update={"tenant": "nova", "id": good.id + "o"})
        answers = {r.id: await ask_execute(bus, r) for r in (tampered, unsigned, other)}
        assert answers[tampered.id].rule == rules.SIGNATURE_INVALID
        assert answers[unsigned.id].rule == rules.SIGNATURE_MISSING
        assert answers[other.id].rule == rules.SIGNATURE_INVALID
        assert all(not a.ok and a.rows == [] for a in answers.values())

        acme = await audit_events(bus, "acme", {refused.request_id, tampered.id, unsigned.id})
        nova = await audit_events(bus, "nova", {other.id})
    assert acme[refused.request_id][0].verdict == "rejected"
    assert acme[refused.request_id][0].rule == rules.TABLE_NOT_ALLOWED
    assert acme[tampered.id][0].rule == rules.SIGNATURE_INVALID
    assert acme[unsigned.id][0].rule == rules.SIGNATURE_MISSING
    assert nova[other.id][0].verdict == "rejected"


async def test_runaway_killed_and_audited_busy_answered_over_nats(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, audit_stream: None
) -> None:
    async with sql_services(nats_url, sqlenv, sql_explain_gate=False, sql_statement_timeout=1.0,
                        sql_pool_size=1, sql_busy_timeout=0.05):  # fmt: skip
        req = execute_request(await ask_validate(bus, sqlenv, RUNAWAY), sqlenv)
        started = time.monotonic()
        runaway = asyncio.create_task(ask_execute(bus, req))
        await asyncio.sleep(0.3)  # the runaway holds the pool's one connection by now
        quick = execute_request(await ask_validate(bus, sqlenv, "SELECT 1"), sqlenv)
        t0 = time.monotonic()
        busy = await ask_execute(bus, quick)
        assert busy.rule == rules.POOL_BUSY and time.monotonic() - t0 < 0.5
        killed = await runaway
        assert killed.killed and killed.rule == rules.EXEC_KILLED
        assert time.monotonic() - started < 1.0 + 1.0
        events = await audit_events(bus, "acme", {req.id, quick.id})
    assert events[req.id][0].killed and events[req.id][0].verdict == "killed"
    assert events[quick.id][0].verdict == "busy"


async def test_explain_subject_returns_the_plan(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, audit_stream: None
) -> None:
    async with sql_services(nats_url, sqlenv):
        req = execute_request(
            await ask_validate(bus, sqlenv, "SELECT COUNT(*) FROM sessions WHERE duration_s > 9"),
            sqlenv,
        )
        plan = await ask_execute(bus, req)
    assert plan.rows == [] and plan.plan and plan.plan[0]["table"] == "sessions"
    assert not plan.ok and plan.rule in (rules.EXPLAIN_FULL_SCAN, rules.EXPLAIN_ROWS)
    assert not plan.gate_passed and plan.error and plan.error.code == "rejected_sql"


async def test_validator_fails_closed_without_an_audit_trail(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_: object, **__: object) -> None:
        raise TimeoutError("AUDIT did not acknowledge")

    monkeypatch.setattr(validator_service, "publish_audit", broken)
    async with sql_services(nats_url, sqlenv):
        with pytest.raises(SwitchyardError) as info:
            await ask_validate(bus, sqlenv, "SELECT 1")
    assert info.value.code == "internal" and "audit" in info.value.reason


async def test_the_service_processes_start_answer_and_stop(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, audit_stream: None
) -> None:
    env = {
        **os.environ, "PYTHONPATH": str(REPO), "SY_NATS_URL": nats_url,
        "SY_SQL_SIGNING_KEY": sqlenv.signing_key, "SY_SQL_POLICY_DIR": str(sqlenv.policy_dir),
        "SY_SQL_DB_SECRET": sqlenv.db_secret, "SY_SQL_DEMO_PREFIX": sqlenv.prefix,
        "SY_SQL_SCHEMA_PREFIX": sqlenv.prefix + "t_", "SY_SQL_ACCOUNT_PREFIX": sqlenv.prefix,
        "SY_SQL_EXPLAIN_MAX_ROWS": "5000", "SY_SQL_EXPLAIN_LARGE_TABLE_ROWS": "5000",
    }  # fmt: skip
    procs = [
        subprocess.Popen([sys.executable, "-m", f"services.{name}"], cwd=REPO, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for name in ("validator", "executor")
    ]  # fmt: skip

    def alive() -> None:
        for p in procs:
            assert p.poll() is None, (p.args, p.stderr.read() if p.stderr else b"")

    try:
        for subject in (subjects.SQL_VALIDATE, subjects.SQL_EXECUTE):
            await wait_for_responder(bus.nc, subject, timeout=60, check=alive)
        validated = await ask_validate(bus, sqlenv, "SELECT COUNT(*) FROM regions")
        result = await ask_execute(bus, execute_request(validated, sqlenv))
        assert result.ok and result.rows == [[5]]
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(20) for p in procs]
    assert codes == [0, 0], [p.stderr.read() if p.stderr else b"" for p in procs]
