"""A private audit environment for auditor tests, and the auditor as a real process.

`audit_env(...)` provisions an audit database and an INSERT-only account named
with a unique prefix (dropped at the end); `audit_stream(...)` declares a
stream and durable on a private subject prefix; `AuditorProcess` runs
`python -m services.auditor` against them, so a test can `kill -9` it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext

from services.auditor.settings import AuditorSettings
from switchyard.bus.provision import ensure_consumer, ensure_stream
from switchyard.bus.publish import MSG_ID
from switchyard.bus.topology import ConsumerSpec, StreamSpec
from switchyard.codec import encode
from switchyard.messages.sql import AuditEvent
from switchyard.sqldb import auditchain
from switchyard.sqldb.admin import connect_admin, dsn_params
from switchyard.sqldb.naming import Naming
from switchyard.sqldb.provision import provision_auditor
from tests.support.sqlenv import drop_service_accounts

REPO = Path(__file__).resolve().parents[2]


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

    def count(self, conn: Any = None) -> int:
        """Rows in the audit table; pass an open admin connection to poll cheaply."""
        sql = f"SELECT COUNT(*) FROM `{self.db}`.sql_audit"
        if conn is None:
            return int(self.scalar(sql))
        with conn.cursor() as cur:
            cur.execute(sql)
            return int(cur.fetchone()[0])

    def event_ids(self) -> list[str]:
        conn = self.admin()
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT event_id FROM `{self.db}`.sql_audit")
                return [str(r[0]) for r in cur.fetchall()]
        finally:
            conn.close()

    def verify(self, tenant: str | None = None) -> auditchain.VerifyReport:
        conn = self.admin()
        try:
            return auditchain.verify(conn, self.db, tenant)
        finally:
            conn.close()

    def subject(self, tenant: str, kind: str = "sql") -> str:
        return f"{self.subject_prefix}.audit.{kind}.{tenant}"

    def process_env(self) -> dict[str, str]:
        """The auditor's settings as `SY_` variables, for a subprocess."""
        s = self.settings
        assert s.sql_audit_password is not None
        values = {
            # Production-like: the audit account's own password, no SY_SQL_DB_SECRET, and
            # placeholders refused (any SY_ENV but local); `test`, not `production`, since
            # this NATS has no TLS or nkeys, which production requires.
            "SY_ENV": "test",
            "SY_NATS_URL": s.nats_url,
            "SY_MYSQL_HOST": s.mysql_host,
            "SY_MYSQL_PORT": str(s.mysql_port),
            "SY_SQL_AUDIT_PASSWORD": s.sql_audit_password.get_secret_value(),
            "SY_SQL_ACCOUNT_PREFIX": s.sql_account_prefix,
            "SY_SQL_AUDIT_DB": s.sql_audit_db,
            "SY_AUDIT_STREAM": s.audit_stream,
            "SY_AUDIT_DURABLE": s.audit_durable,
            "SY_AUDIT_BATCH": str(s.audit_batch),
            "SY_AUDIT_LINGER": str(s.audit_linger),
            "SY_AUDIT_ACK_WAIT": str(s.audit_ack_wait),
            "SY_DRAIN_TIMEOUT": str(s.drain_timeout),
            "SY_METRICS_PORT": "0",
            "SY_LOG_LEVEL": "info",
        }
        keep = {k: v for k, v in os.environ.items() if not k.startswith("SY_")}
        return {**keep, **values, "PYTHONPATH": str(REPO)}


@contextlib.contextmanager
def audit_env(mysql_dsn: str, unique: str, nats_url: str, **overrides: Any) -> Iterator[AuditEnv]:
    """An audit database, its INSERT-only account and auditor settings, all private."""
    prefix = f"au{unique}_"
    naming = Naming(prefix, prefix + "t_", prefix, secrets.token_hex(16).encode())
    db = f"{prefix}audit"
    password = secrets.token_urlsafe(24)  # the audit account's own, as in production
    params = dsn_params(mysql_dsn)
    fields: dict[str, Any] = {
        "nats_url": nats_url, "mysql_host": params["host"], "mysql_port": params["port"],
        "sql_audit_password": password, "sql_account_prefix": prefix,
        "sql_audit_db": db, "audit_stream": f"AUDIT_{unique}", "audit_durable": "auditor",
        "audit_batch": 25, "audit_linger": 0.02, "drain_timeout": 5,
    }  # fmt: skip
    settings = AuditorSettings(**{**fields, **overrides})
    conn = connect_admin(mysql_dsn)
    try:
        provision_auditor(conn, naming, host="%", audit_db=db, password=password)
        yield AuditEnv(
            mysql_dsn, db, prefix, naming, settings.audit_stream, f"au{unique}", settings
        )
    finally:
        drop_service_accounts(conn, naming, host="%", audit_db=db)
        conn.close()


async def audit_stream(
    js: JetStreamContext, env: AuditEnv, *, ack_wait: float = 5.0, max_ack_pending: int = 1000
) -> None:
    """A file-backed limits stream on `<prefix>.audit.>` and the auditor's durable, like AUDIT."""
    subjects = f"{env.subject_prefix}.audit.>"
    await ensure_stream(js, StreamSpec(env.stream, (subjects,), "limits", 0, "file"))
    await ensure_consumer(
        js,
        ConsumerSpec(
            env.stream, env.settings.audit_durable, subjects, ack_wait, 6, max_ack_pending
        ),
    )


def sql_event(tenant: str, i: int) -> AuditEvent:
    return AuditEvent(
        tenant=tenant, request_id=f"r{i}", event="execute", actor="executor", verdict="ok",
        sql=f"SELECT {i} FROM dau", question=f"question {i}", rows_scanned=i, rows_returned=1,
        duration=0.0123, plan=[{"table": "dau", "rows": i}],
    )  # fmt: skip


async def publish_event(js: JetStreamContext, env: AuditEnv, event: AuditEvent,
                        timeout: float = 5.0) -> None:  # fmt: skip
    """Publish and wait for the stream's ack; the event id is the dedupe id."""
    await js.publish(env.subject(event.tenant), encode(event), headers={MSG_ID: event.id},
                     timeout=timeout)  # fmt: skip


class AuditorProcess:
    """`python -m services.auditor` as a child process, logging to `log`."""

    def __init__(self, env: AuditEnv, log: Path, **settings: str) -> None:
        self.env = env
        self.log = log
        self.extra = {f"SY_{k.upper()}": v for k, v in settings.items()}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout: float = 30.0) -> AuditorProcess:
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.auditor"],
                cwd=REPO, env={**self.env.process_env(), **self.extra},
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"auditor exited with {self.proc.returncode}:\n{self.tail()}")
            if b"auditor.ready" in self.log.read_bytes()[offset:]:
                return self
            time.sleep(0.05)
        raise TimeoutError(f"auditor not ready within {ready_timeout}s:\n{self.tail()}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM (graceful drain), then SIGKILL if it hangs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def tail(self, n: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
