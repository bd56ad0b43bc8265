"""Answering a request exactly once, whoever answers it (preprocessor, router, worker, sqlflow).

The final goes to `RES` first, deduplicated by `res-<request id>`: if an
earlier attempt (a worker that died after answering, a router restarted
mid-dispatch, a question redelivered) already answered, the stream says so and
nothing is sent twice. Then the reply inbox gets it (`bus.reply` reads it): a
`GenerateResult` as the token stream's terminal frame (`end` with the result, or
`error` with the reason when the request was refused or failed), a `SqlAnswer`
as itself after the question's stages.
"""

from __future__ import annotations

import time

from nats.aio.client import Client
from nats.js import JetStreamContext

from switchyard import subjects
from switchyard.bus.publish import FAILOVER_PATIENCE, publish
from switchyard.bus.tokenstream import TokenStreamWriter
from switchyard.codec import encode
from switchyard.envelope import Envelope
from switchyard.messages.inference import (
    ErrorInfo,
    GenerateRequest,
    GenerateResult,
    ResultStatus,
    Route,
    Timings,
    Workload,
)
from switchyard.messages.sql import SqlAnswer


def route_of(
    req: GenerateRequest,
    finished_at: float,
    started_at: float | None = None,
    first_token_at: float | None = None,
) -> Route:
    """The request's path through the fleet, from the times each hop stamped on it."""
    return Route(
        pool=req.pool, partition=req.partition, routed_to=req.routed_to,
        created_at=req.created_at, prepared_at=req.prepared_at, admitted_at=req.admitted_at,
        dispatched_at=req.dispatched_at, started_at=started_at, first_token_at=first_token_at,
        finished_at=finished_at,
    )  # fmt: skip


def result_for(
    req: GenerateRequest, status: ResultStatus, error: ErrorInfo | None = None, **fields: object
) -> GenerateResult:
    now = time.time()
    fields.setdefault("route", route_of(req, now))
    return _result(req, req.workload, req.admitted_at or req.created_at, now, status, error, fields)


def refusal_for(
    message: Envelope, workload: Workload, pool: str, status: ResultStatus, error: ErrorInfo
) -> GenerateResult:
    """The answer to a message refused before it became a `GenerateRequest` (an agent step
    the preprocessor will not prepare): its route has no hop between creation and the end."""
    now = time.time()
    route = Route(pool=pool, created_at=message.created_at, finished_at=now)
    return _result(message, workload, message.created_at, now, status, error, {"route": route})


def _result(
    message: Envelope,
    workload: Workload,
    since: float,
    now: float,
    status: ResultStatus,
    error: ErrorInfo | None,
    fields: dict[str, object],
) -> GenerateResult:
    fields.setdefault("timings", Timings(queue=max(0.0, now - since), total=max(0.0, now - since)))
    if status in ("cancelled", "expired", "stale", "superseded"):
        fields.setdefault("finish_reason", "abort")
    return GenerateResult(
        tenant=message.tenant,
        session=message.session,
        frame_ts=message.frame_ts,
        trace=message.trace,
        request_id=message.id,
        workload=workload,
        status=status,
        error=error,
        **fields,  # type: ignore[arg-type]
    )


async def answer(
    nc: Client,
    js: JetStreamContext,
    result: GenerateResult | SqlAnswer,
    reply: str | None,
    writer: TokenStreamWriter | None = None,
) -> bool:
    """Publish `result` and end the reply stream (`writer`, if one is already open on
    `reply`); False if the request was already answered."""
    workload = "sql" if isinstance(result, SqlAnswer) else result.workload
    ack = await publish(
        js, subjects.res(workload, result.tenant), result,
        msg_id=f"res-{result.request_id}", patience=FAILOVER_PATIENCE,
    )  # fmt: skip
    if ack.duplicate:
        return False
    if isinstance(result, SqlAnswer):
        if reply:
            await nc.publish(reply, encode(result))
            await nc.flush()
        return True
    if writer is None and reply:
        writer = TokenStreamWriter(nc, reply)
    if writer is not None:
        if result.status in ("rejected", "error") and result.error is not None:
            await writer.error(result.error)
        else:
            await writer.end(result)
    return True
