"""The executor process: `svc.sql.execute`, audited.

No rows leave unaudited: the audit event of a decision is stored in AUDIT
before the reply is sent, and if it cannot be, the caller gets an error
instead of the rows.
"""

from __future__ import annotations

import asyncio
import time

from services.executor import metrics
from services.executor.settings import ExecutorSettings
from switchyard import otel, subjects
from switchyard.bus import rpc
from switchyard.bus.connection import Bus
from switchyard.errors import SwitchyardError
from switchyard.inflight import InFlight
from switchyard.logging import bind_request, get_logger
from switchyard.messages.sql import ExecuteReply, ExecuteRequest
from switchyard.sqldb.executor import SqlExecutor
from switchyard.sqlguard.audit import publish_audit

log = get_logger(__name__)


async def run_executor(bus: Bus, stop: asyncio.Event, settings: ExecutorSettings) -> None:
    executor = SqlExecutor(settings)
    # Before taking work: a database that wants TLS we cannot give stops us here
    # (DbTlsError); one that is away or not provisioned yet only warns, as requests would.
    if not await executor.check_login():
        log.warning(
            "executor.db_login_failed", mysql=f"{settings.mysql_host}:{settings.mysql_port}"
        )
    inflight = InFlight()
    tracer = otel.tracer("executor")

    async def handle(req: ExecuteRequest) -> ExecuteReply:
        metrics.INFLIGHT.inc()
        try:
            with (
                inflight,
                bind_request(req.id, req.tenant, req.trace),
                tracer.hop("executor", req.trace),
            ):
                started = time.perf_counter()
                decision = await executor.handle(req)
                event = decision.audit.event
                metrics.DURATION.labels(event).observe(time.perf_counter() - started)
                metrics.DECISIONS.labels(
                    event, decision.audit.verdict or "-", decision.audit.rule or "-"
                ).inc()
                if decision.reply.killed:
                    metrics.KILLS.labels(decision.reply.kill_reason or "-").inc()
                try:
                    await publish_audit(bus.js, decision.audit)
                except Exception as exc:
                    metrics.AUDIT_FAILURES.inc()
                    log.error("sql.audit_failed", error=str(exc))
                    raise SwitchyardError(
                        "the audit trail is unavailable; no result leaves unaudited",
                        code="internal",
                    ) from exc
                log.info(
                    "sql.executed",
                    kind=event,
                    verdict=decision.audit.verdict,
                    rule=decision.audit.rule,
                    rows=decision.audit.rows_returned,
                    duration=round(decision.reply.duration, 4),
                )
                return decision.reply
        finally:
            metrics.INFLIGHT.dec()

    sub = await rpc.serve(
        bus.nc, subjects.SQL_EXECUTE, ExecuteRequest, handle, queue="executor",
        concurrency=settings.sql_max_inflight,
    )  # fmt: skip
    log.info(
        "executor.ready",
        mysql=f"{settings.mysql_host}:{settings.mysql_port}",
        pool=settings.sql_pool_size,
        gate=settings.sql_explain_gate,
        tls=executor.tls is not None,
    )
    try:
        await stop.wait()
        await sub.unsubscribe()
        if not await inflight.drained(settings.drain_timeout):
            log.warning("executor.drain_timeout", inflight=inflight.count)
    finally:
        executor.close()
