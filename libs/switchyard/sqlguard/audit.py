"""Audit events of SQL decisions, on `audit.sql.<tenant>` (stream AUDIT).

An event says what was decided about which statement: tenant, SQL text and
hash, verdict, rule, plan summary, rows scanned and returned, duration,
killed or not. It never carries result rows: only counts leave the executor
towards the audit trail.
"""

from __future__ import annotations

from typing import Any

from nats.js import JetStreamContext

from switchyard import subjects
from switchyard.bus.publish import publish
from switchyard.messages.sql import AuditEvent
from switchyard.sqlguard.signing import sql_hash

MAX_SQL = 64 * 1024


def sql_audit(
    *,
    tenant: str,
    request_id: str,
    event: str,
    actor: str,
    verdict: str,
    sql: str | None,
    rule: str | None = None,
    question: str | None = None,
    plan: list[dict[str, Any]] | None = None,
    rows_scanned: int | None = None,
    rows_returned: int | None = None,
    duration: float | None = None,
    killed: bool = False,
    trace: str | None = None,
    **detail: Any,
) -> AuditEvent:
    return AuditEvent(
        tenant=tenant,
        request_id=request_id,
        event=event,
        actor=actor,
        verdict=verdict,
        rule=rule,
        question=question,
        sql=sql[:MAX_SQL] if sql else None,
        sql_hash=sql_hash(sql) if sql else None,
        killed=killed,
        plan=(plan or [])[:64],
        rows_scanned=rows_scanned,
        rows_returned=rows_returned,
        duration=duration,
        detail={k: v for k, v in detail.items() if v is not None},
        trace=trace,
    )


# How long a decision waits for AUDIT to take its event while a cluster elects AUDIT's
# leader (2-10 s measured here): nothing is approved unaudited, so without it a question
# asked in an election was dead-lettered after its handler's few quick retries
# (tests/integration/test_sql_failover.py); within sqlflow's 20 s guard timeout.
AUDIT_PATIENCE = 12.0


async def publish_audit(js: JetStreamContext, event: AuditEvent, timeout: float = 2.0) -> None:
    """Store the event in AUDIT, patient through a leader election (`AUDIT_PATIENCE`, each
    attempt `timeout`); raises if the stream still does not acknowledge it."""
    await publish(
        js, subjects.audit("sql", event.tenant), event, timeout=timeout, patience=AUDIT_PATIENCE
    )
