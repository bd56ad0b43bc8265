"""The auditor on a real nats-server and a real MariaDB: stored once, chained, redacted.

Everything is private to the test: a stream on `au<unique>.audit.>`, an audit
database and an INSERT-only account named with a unique prefix, removed at the end.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pymysql
import pytest
from typer.testing import CliRunner

from services.auditor.redact import MASK
from services.auditor.service import run_auditor
from services.auditor.settings import AuditorSettings
from switchyard.bus.connection import Bus
from switchyard.bus.provision import ensure_consumer, ensure_stream
from switchyard.bus.publish import MSG_ID
from switchyard.bus.topology import ConsumerSpec, StreamSpec
from switchyard.cli.app import app
from switchyard.codec import encode
from switchyard.messages.sql import AuditEvent
from switchyard.sqldb import auditchain
from switchyard.sqldb.admin import connect_admin, dsn_params
from switchyard.sqldb.naming import Naming
from switchyard.sqldb.provision import drop_service_accounts, provision_auditor

TENANTS = ("acme", "nova", "orbit")
PER_TENANT = 40


@dataclass
class AuditEnv:
    dsn: str
    db: str
    prefix: str
    naming: Naming
    stream: str
    subject_prefix: str
    settings: AuditorSettings

    def admin(self) -> Any:
        return connect_admin(self.dsn)

    def scalar(self, sql: str, *args: Any) -> Any:
        conn = self.admin()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                row = cur.fetchone()
                return row[0] if row else None
        finally:
            conn.close()


@pytest.fixture
def audit_db(mysql_dsn: str, unique: str, nats_url: str) -> Iterator[AuditEnv]:
    prefix = f"au{unique}_"
    naming = Naming(prefix, prefix + "t_", prefix, secrets.token_hex(16).encode())
    db = f"{prefix}audit"
    params = dsn_params(mysql_dsn)
    settings = AuditorSettings(
        nats_url=nats_url, mysql_host=params["host"], mysql_port=params["port"],
        sql_db_secret=naming.secret.decode(), sql_account_prefix=prefix, sql_audit_db=db,
        audit_stream=f"AUDIT_{unique}", audit_durable="auditor", audit_batch=25,
        audit_linger=0.02, drain_timeout=5,
    )  # fmt: skip
    conn = connect_admin(mysql_dsn)
    try:
        provision_auditor(conn, naming, host="%", audit_db=db)
        provision_auditor(conn, naming, host="%", audit_db=db)  # idempotent
        yield AuditEnv(mysql_dsn, db, prefix, naming, f"AUDIT_{unique}", f"au{unique}", settings)
    finally:
        drop_service_accounts(conn, naming, host="%", audit_db=db)
        conn.close()


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
                          password=env.naming.password(user), connect_timeout=5)  # fmt: skip
    try:
        with aud.cursor() as cur, pytest.raises(pymysql.err.OperationalError):
            cur.execute(f"SELECT COUNT(*) FROM `{env.db}`.sql_audit")
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
