"""From an `AuditEvent` to a stored row: redaction, the hashed body, batched INSERT IGNORE.

The writer connects as the INSERT-only auditor account; the chain columns
(`seq`, `prev_hash`, `row_hash`) are filled by the table's trigger (see
`switchyard.sqldb.auditchain` for why that keeps replicas consistent).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import pymysql

from services.auditor.redact import redact, redact_text
from switchyard.messages.sql import AuditEvent
from switchyard.sqldb.admin import quote_name as q
from switchyard.sqldb.auditchain import AUDIT_TABLE, canonical, content_hash
from switchyard.sqldb.settings import DatabaseSettings, auditor_password, naming
from switchyard.sqldb.tls import check_login, pymysql_tls, require_encrypted

# Result rows never reach the auditor: the event model has no field for them.
if "rows" in AuditEvent.model_fields:
    raise ImportError("AuditEvent must never carry result rows: the auditor refuses to load")

# The `question` column is TEXT (64 KiB): 4-byte characters fit this many.
MAX_QUESTION = 16_000

# Deadlock, lock wait timeout: the batch is retried as a whole.
RETRYABLE = frozenset({1205, 1213})

_COLUMNS = (
    "event_id", "at", "request_id", "tenant", "kind", "event", "actor", "verdict", "rule",
    "killed", "sql_hash", "sql_text", "question", "plan", "rows_scanned", "rows_returned",
    "duration_ms", "detail", "trace", "content_hash", "body",
)  # fmt: skip


@dataclass(frozen=True)
class Row:
    event_id: str
    tenant: str
    at: dt.datetime
    body: str
    record: dict[str, Any]

    def values(self) -> tuple[Any, ...]:
        r = self.record
        return (
            r["event_id"], self.at, r["request_id"], r["tenant"], r["kind"], r["event"],
            r["actor"], r["verdict"], r["rule"], int(r["killed"]), r["sql_hash"], r["sql_text"],
            r["question"], json.dumps(r["plan"]), r["rows_scanned"], r["rows_returned"],
            r["duration_ms"], json.dumps(r["detail"]), r["trace"], content_hash(self.body),
            self.body,
        )  # fmt: skip


def _opt(text: str | None) -> str | None:
    return redact_text(text) if text is not None else None


def _cap(text: str | None, n: int) -> str | None:
    return text[:n] if text is not None else None


def kind_of(subject: str) -> str:
    """`audit.<kind>.<tenant>` -> kind (the last-but-one token, so prefixed subjects work)."""
    parts = subject.split(".")
    return parts[-2] if len(parts) >= 3 else "unknown"


def to_row(event: AuditEvent, kind: str) -> Row:
    """The redacted record of `event`; its canonical JSON is what the chain hashes."""
    at = dt.datetime.fromtimestamp(event.created_at, dt.UTC).replace(tzinfo=None)
    record: dict[str, Any] = {
        "event_id": event.id,
        "at": at.isoformat(timespec="microseconds"),
        "request_id": event.request_id,
        "tenant": event.tenant,
        "kind": kind[:64],
        "event": event.event[:64],
        "actor": event.actor[:64],
        "verdict": _cap(event.verdict, 32),
        "rule": _cap(event.rule, 64),
        "killed": event.killed,
        "sql_hash": event.sql_hash,
        "sql_text": _opt(event.sql),
        "question": _cap(_opt(event.question), MAX_QUESTION),
        "plan": redact(event.plan),
        "rows_scanned": event.rows_scanned,
        "rows_returned": event.rows_returned,
        "duration_ms": None if event.duration is None else round(event.duration * 1000, 3),
        "detail": redact(event.detail),
        "subject_tenant": event.subject_tenant,
        "trace": event.trace,
    }
    return Row(event.id, event.tenant, at, canonical(record), record)


class AuditWriter:
    """One connection as the INSERT-only account; `write` stores a batch in one transaction."""

    def __init__(self, settings: DatabaseSettings, *, user: str | None = None,
                 password: str | None = None) -> None:  # fmt: skip
        names = naming(settings)
        self.settings = settings
        self.user = user or names.auditor_user
        self.password = password if password is not None else auditor_password(settings)
        self.tls = settings.tls_context()
        self._sql = (
            f"INSERT IGNORE INTO {q(settings.sql_audit_db)}.{q(AUDIT_TABLE)} "  # noqa: S608
            f"({', '.join(_COLUMNS)}) VALUES ({', '.join(['%s'] * len(_COLUMNS))})"
        )
        self._conn: pymysql.connections.Connection[Any] | None = None

    def _connect(self) -> pymysql.connections.Connection[Any]:
        if self._conn is None or not self._conn.open:
            conn = pymysql.connect(
                host=self.settings.mysql_host, port=self.settings.mysql_port, user=self.user,
                password=self.password, charset="utf8mb4", autocommit=False,
                connect_timeout=5, read_timeout=30, write_timeout=30, **pymysql_tls(self.tls),
            )  # fmt: skip
            where = f"the database at {self.settings.mysql_host}:{self.settings.mysql_port}"
            require_encrypted(conn, self.tls, where)
            with conn.cursor() as cur:
                # No gap locks on the trigger's reads; per-tenant order comes from the head lock.
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            conn.commit()
            self._conn = conn
        return self._conn

    def check_login(self) -> bool:
        """The start-up check (`sqldb.tls.check_login`) as the audit account. Blocking."""
        s = self.settings
        return check_login(s.mysql_host, s.mysql_port, self.user, self.password, self.tls)

    def write(self, rows: list[Row], attempts: int = 3) -> int:
        """Insert `rows` (deduplicated, sorted by tenant) in one transaction; return how many
        were new. Blocking: run it in a thread."""
        unique = {r.event_id: r for r in rows}
        batch = sorted(unique.values(), key=lambda r: (r.tenant, r.at, r.event_id))
        for attempt in range(attempts):
            conn = self._connect()
            try:
                with conn.cursor() as cur:
                    # one multi-row INSERT IGNORE; the trigger runs per row, in this order
                    inserted = int(cur.executemany(self._sql, [r.values() for r in batch]) or 0)
                conn.commit()
                return inserted
            except pymysql.err.OperationalError as exc:
                self._rollback()
                if exc.args and exc.args[0] in RETRYABLE and attempt + 1 < attempts:
                    continue
                raise
            except Exception:
                self._rollback()
                raise
        return 0  # pragma: no cover

    def _rollback(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # the connection is dropped either way
                conn.rollback()
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        if self._conn is not None and self._conn.open:
            self._conn.close()
        self._conn = None
