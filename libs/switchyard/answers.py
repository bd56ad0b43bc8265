"""Answering a request exactly once, whoever answers it (router or worker).

The result goes to `RES` first, deduplicated by `res-<request id>`: if an
earlier attempt (a worker that died after answering, a router restarted
mid-dispatch) already answered, the stream says so and nothing is sent twice.
Then the reply inbox gets the terminal frame: `end` with the result, or
`error` with the reason when the request was refused or failed.
"""

from __future__ import annotations

import time

from nats.aio.client import Client
from nats.js import JetStreamContext

from switchyard import subjects
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamWriter
from switchyard.messages.inference import (
    ErrorInfo,
    GenerateRequest,
    GenerateResult,
    ResultStatus,
    Route,
    Timings,
)


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
    since = req.admitted_at or req.created_at
    fields.setdefault("timings", Timings(queue=max(0.0, now - since), total=max(0.0, now - since)))
    fields.setdefault("route", route_of(req, now))
    if status in ("cancelled", "expired", "stale"):
        fields.setdefault("finish_reason", "abort")
    return GenerateResult(
        tenant=req.tenant,
        session=req.session,
        frame_ts=req.frame_ts,
        trace=req.trace,
        request_id=req.id,
        workload=req.workload,
        status=status,
        error=error,
        **fields,  # type: ignore[arg-type]
    )


async def answer(
    nc: Client,
    js: JetStreamContext,
    req: GenerateRequest,
    result: GenerateResult,
    writer: TokenStreamWriter | None = None,
) -> bool:
    """Publish `result` and end the reply stream; False if it was already answered."""
    ack = await publish(js, subjects.res(req.workload, req.tenant), result, msg_id=f"res-{req.id}")
    if ack.duplicate:
        return False
    if req.reply:
        writer = writer or TokenStreamWriter(nc, req.reply)
        if result.status in ("rejected", "error") and result.error is not None:
            await writer.error(result.error)
        else:
            await writer.end(result)
    return True
