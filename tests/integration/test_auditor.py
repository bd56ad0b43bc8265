"""The auditor on a real nats-server and a real MariaDB: stored once, chained, redacted.

Everything is private to the test: a stream on `au<unique>.audit.>`, an audit
database and an INSERT-only account named with a unique prefix, removed at the end.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator

import pymysql
import pytest
from typer.testing import CliRunner

from services.auditor.redact import MASK
from services.auditor.service import run_auditor
from switchyard.bus.connection import Bus
from switchyard.bus.provision import ensure_consumer, ensure_stream
from switchyard.bus.publish import MSG_ID
from switchyard.bus.topology import ConsumerSpec, StreamSpec
from switchyard.cli.app import app
from switchyard.codec import encode
from switchyard.messages.sql import AuditEvent
from switchyard.sqldb import auditchain
from switchyard.sqldb.admin import dsn_params
from switchyard.sqldb.provision import provision_auditor
from switchyard.sqldb.settings import auditor_password
from tests.support.auditenv import AuditEnv, audit_env

TENANTS = ("acme", "nova", "orbit")
PER_TENANT = 40


@pytest.fixture
def audit_db(mysql_dsn: str, unique: str, nats_url: str) -> Iterator[AuditEnv]:
    with audit_env(mysql_dsn, unique, nats_url, audit_batch=25, audit_linger=0.02) as env:
        # provisioning twice changes nothing
        conn = env.admin()
        try:
            assert env.settings.sql_audit_password is not None
            password = env.settings.sql_audit_password.get_secret_value()
            provision_auditor(conn, env.naming, host="%", audit_db=env.db, password=password)
        finally:
            conn.close()
        yield env


@pytest.fixture
async def stream(bus: Bus, audit_db: AuditEnv) -> AsyncIterator[str]:
    await ensure_stream(
        bus.js, StreamSpec(audit_db.stream, (f"{audit_db.subject_prefix}.audit.>",), "limits", 0)
    )
    await ensure_consumer(
        bus.js,
        ConsumerSpec(
            audit_db.stream, "auditor", f"{audit_db.subject_prefix}.audit.>", 5.0, 6, 1000
        ),
    )
    yield audit_db.stream
    await bus.js.delete_stream(audit_db.stream)


def _event(tenant: str, i: int) -> AuditEvent:
    return AuditEvent(
        tenant=tenant, request_id=f"r{i}", event="execute", actor="executor", verdict="ok",
        sql=f"SELECT {i} FROM dau", question=f"question {i}", rows_scanned=i, rows_returned=1,
        duration=0.0123, plan=[{"table": "dau", "rows": i}],
    )  # fmt: skip


async def _publish(bus: Bus, env: AuditEnv, event: AuditEvent, msg_id: str) -> None:
    subject = f"{env.subject_prefix}.audit.sql.{event.tenant}"
    await bus.js.publish(subject, encode(event), headers={MSG_ID: msg_id})


async def _wait_rows(env: AuditEnv, n: int, timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    count = 0
    while time.monotonic() < deadline:
        count = int(env.scalar(f"SELECT COUNT(*) FROM `{env.db}`.sql_audit"))
        if count >= n:
            return count
        await asyncio.sleep(0.1)
    return count


async def _wait_acked(bus: Bus, env: AuditEnv, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = await bus.js.consumer_info(env.stream, "auditor")
        if info.num_pending == 0 and info.num_ack_pending == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the auditor did not ack everything")


def _verify(env: AuditEnv, tenant: str | None = None) -> auditchain.VerifyReport:
    conn = env.admin()
    try:
        return auditchain.verify(conn, env.db, tenant)
    finally:
        conn.close()


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["audit", *args], env={"COLUMNS": "200", "NO_COLOR": "1"})
    return result.exit_code, result.output


async def test_auditor_stores_once_chains_redacts_and_detects_tampering(
    bus: Bus, audit_db: AuditEnv, stream: str
) -> None:
    env = audit_db
    events = [_event(t, i) for t in TENANTS for i in range(PER_TENANT)]
    secret = AuditEvent(
        tenant="acme", request_id="rsecret", event="execute", actor="executor", verdict="ok",
        question="my key is sk-livelivelive0123456789, show DAU",
        sql="SELECT 1 /* mysql://app:hunter2@db:3306 */",
        detail={"note": "Authorization: Bearer abcdefghijklmnop", "password": "pw", "n": 1},
    )  # fmt: skip
    events.append(secret)
    stop = asyncio.Event()
    # two replicas on the same durable consumer: the chain must still be one line per tenant
    replicas = [asyncio.create_task(run_auditor(bus, stop, env.settings)) for _ in range(2)]
    try:
        for e in events:
            await _publish(bus, env, e, e.id)
        # the same events again under other message ids: JetStream stores them twice,
        # as if redelivered after a crash; the table must still hold each once
        for e in events[::4]:
            await _publish(bus, env, e, f"{e.id}-again")
        assert await _wait_rows(env, len(events)) == len(events)
        await _wait_acked(bus, env)
        await asyncio.sleep(0.3)  # any late duplicate would show up now
    finally:
        stop.set()
        await asyncio.gather(*replicas)

    total = env.scalar(f"SELECT COUNT(*) FROM `{env.db}`.sql_audit")
    distinct = env.scalar(f"SELECT COUNT(DISTINCT event_id) FROM `{env.db}`.sql_audit")
    assert total == distinct == len(events)
    assert (
        env.scalar(f"SELECT MAX(seq) FROM `{env.db}`.sql_audit WHERE tenant='nova'") == PER_TENANT
    )

    # the auditor's account can INSERT and nothing else
    user = env.naming.auditor_user
    params = dsn_params(env.dsn)
    aud = pymysql.connect(host=params["host"], port=params["port"], user=user,
                          password=auditor_password(env.settings), connect_timeout=5)  # fmt: skip
    try:
        with aud.cursor() as cur:
            for statement in (
                f"SELECT COUNT(*) FROM `{env.db}`.sql_audit",
                f"UPDATE `{env.db}`.sql_audit SET verdict = 'x'",
                f"DELETE FROM `{env.db}`.sql_audit",
                f"UPDATE `{env.db}`.sql_audit_head SET seq = 0",
                f"DROP TRIGGER `{env.db}`.sql_audit_chain",
            ):
                with pytest.raises(pymysql.err.OperationalError, match="denied"):
                    cur.execute(statement)
            cur.execute("SHOW GRANTS")
            grants = [str(r[0]) for r in cur.fetchall()]
        granted = [g for g in grants if "USAGE" not in g]
        assert len(granted) == 1 and granted[0].startswith("GRANT INSERT ON"), grants
        assert "sql_audit" in granted[0]
    finally:
        aud.close()

    # secrets redacted in every stored form
    conn = env.admin()
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT question, sql_text, detail, body, plan FROM `{env.db}`.sql_audit "
                "WHERE event_id = %s",
                (secret.id,),
            )
            question, sql_text, detail, body, _ = cur.fetchone()
    finally:
        conn.close()
    for stored in (question, sql_text, detail, body):
        for leaked in ("sk-livelivelive", "hunter2", "abcdefghijklmnop", '"pw"'):
            assert leaked not in stored
    assert MASK in question and json.loads(detail)["password"] == MASK

    # the chain verifies, through the library and the CLI
    report = _verify(env)
    assert report.ok and report.rows == len(events) and report.tenants == len(TENANTS)
    code, out = _cli("verify", "--dsn", env.dsn, "--db", env.db)
    assert code == 0 and "OK" in out, out

    # query: JSON lines of one tenant, filtered by kind
    code, out = _cli("query", "--tenant", "orbit", "--since", "1h", "--kind", "sql", "--json",
                     "--dsn", env.dsn, "--db", env.db)  # fmt: skip
    assert code == 0, out
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(lines) == PER_TENANT and {r["kind"] for r in lines} == {"sql"}
    code, out = _cli("query", "--tenant", "orbit", "--kind", "agent", "--json",
                     "--dsn", env.dsn, "--db", env.db)  # fmt: skip
    assert code == 0 and out.strip() == ""
    code, out = _cli("query", "--tenant", "acme", "--dsn", env.dsn, "--db", env.db)
    assert code == 0 and "executor" in out and f"{PER_TENANT + 1} event(s)" in out
    # a cut output says so
    code, out = _cli("query", "--tenant", "acme", "--limit", "5", "--dsn", env.dsn, "--db", env.db)
    assert code == 0 and "5 event(s)" in out and "more than 5 events" in out, out

    # tampering as root is caught at the first broken link
    conn = env.admin()
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"UPDATE `{env.db}`.sql_audit SET question = 'nothing to see' "
                "WHERE tenant = 'nova' AND seq = 7"
            )
    finally:
        conn.close()
    code, out = _cli("verify", "--dsn", env.dsn, "--db", env.db, "--tenant", "nova")
    assert code == 1 and "BROKEN" in out and "seq 7" in out and "question" in out, out
    code, out = _cli("verify", "--dsn", env.dsn, "--db", env.db, "--tenant", "orbit")
    assert code == 0, out

    # a deleted tail is caught by the head
    conn = env.admin()
    try:
        with conn.cursor() as cur:
            cur.execute(f"DELETE FROM `{env.db}`.sql_audit WHERE tenant = 'orbit' AND seq = %s",
                        (PER_TENANT,))  # fmt: skip
    finally:
        conn.close()
    report = _verify(env, "orbit")
    assert report.broken is not None and "head" in report.broken.reason

    # an edited JSON column, and a row written around the trigger, are caught too
    conn = env.admin()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT plan FROM `{env.db}`.sql_audit WHERE tenant = 'acme' AND seq = 3")
            plan = json.loads(cur.fetchone()[0])
            assert plan[0]["rows"] >= 0  # the EXPLAIN estimate is kept, it is no result row
            cur.execute(
                f"UPDATE `{env.db}`.sql_audit SET detail = '{{\"approved\": true}}' "
                "WHERE tenant = 'acme' AND seq = 3"
            )
    finally:
        conn.close()
    report = _verify(env, "acme")
    assert report.broken is not None and report.broken.seq == 3
    assert "detail" in report.broken.reason
    conn = env.admin()
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO `{env.db}`.sql_audit (at, request_id, tenant, event, actor) "
                "VALUES (NOW(6), 'forged', 'zen', 'execute', 'executor')"
            )
    finally:
        conn.close()
    code, out = _cli("verify", "--dsn", env.dsn, "--db", env.db, "--tenant", "zen")
    assert code == 1 and "tenant zen (row id" in out and "outside the hash chain" in out, out
