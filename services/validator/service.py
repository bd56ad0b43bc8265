"""The validator process: `svc.sql.validate` request/reply, audited, fail closed.

A verdict is only returned once its audit event is stored: if AUDIT does not
acknowledge it, the caller gets an error and no signature.
"""

from __future__ import annotations

import asyncio
import time

from services.validator import metrics
from services.validator.settings import ValidatorSettings
from switchyard import otel, subjects
from switchyard.bus import rpc
from switchyard.bus.connection import Bus
from switchyard.errors import SwitchyardError
from switchyard.inflight import InFlight
from switchyard.logging import bind_request, get_logger
from switchyard.messages.sql import ValidateReply, ValidateRequest
from switchyard.sqlguard.approval import Approver
from switchyard.sqlguard.audit import publish_audit
from switchyard.sqlguard.policy import PolicyStore

log = get_logger(__name__)


async def run_validator(bus: Bus, stop: asyncio.Event, settings: ValidatorSettings) -> None:
    approver = Approver(
        PolicyStore(settings.sql_policy_dir), settings.sql_signing_key.get_secret_value().encode()
    )
    inflight = InFlight()
    tracer = otel.tracer("validator")

    async def handle(req: ValidateRequest) -> ValidateReply:
        with (
            inflight,
            bind_request(req.id, req.tenant, req.trace),
            tracer.hop("validator", req.trace),
        ):
            started = time.perf_counter()
            reply, event, verdict = approver.decide(req)
            metrics.LATENCY.observe(time.perf_counter() - started)
            metrics.DECISIONS.labels("ok" if verdict.ok else "rejected", verdict.rule or "-").inc()
            try:
                await publish_audit(bus.js, event)
            except Exception as exc:
                metrics.AUDIT_FAILURES.inc()
                log.error("sql.audit_failed", error=str(exc))
                raise SwitchyardError(
                    "the audit trail is unavailable; nothing is approved unaudited",
                    code="internal",
                ) from exc
            log.info("sql.validated", ok=verdict.ok, rule=verdict.rule)
            return reply

    sub = await rpc.serve(
        bus.nc,
        subjects.SQL_VALIDATE,
        ValidateRequest,
        handle,
        queue="validator",
        concurrency=settings.validator_concurrency,
    )
    log.info("validator.ready", policies=str(settings.sql_policy_dir))
    await stop.wait()
    await sub.unsubscribe()
    if not await inflight.drained(settings.drain_timeout):
        log.warning("validator.drain_timeout", inflight=inflight.count)
