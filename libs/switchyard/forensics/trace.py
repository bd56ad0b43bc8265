"""Rebuilding one request's path through the fleet from what the streams kept.

Nothing records a trace on purpose: the pieces are already durable. `INGRESS` holds
what the client sent (with the edge's `created_at`), `RES` the result, whose `route`
carries the time each hop stamped on the request (prepared, admitted, dispatched to a
partition and worker, started, first token, finished), `AUDIT` every decision taken
about it, `DLQ` anything given up on. A SQL question's model calls are separate
requests with child spans of the question's trace, so they are found by trace id.

Ids are time-sortable, so the search starts a little before the id's own time and
reads a bounded window after it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from nats.js import JetStreamContext

from switchyard.bus.publish import MSG_ID
from switchyard.bus.streamread import Window, read
from switchyard.codec import decode, envelope_or_none
from switchyard.envelope import Envelope
from switchyard.errors import DecodeError, SwitchyardError
from switchyard.ids import id_time
from switchyard.messages.deadletter import DeadLetter
from switchyard.messages.inference import GenerateResult, Route
from switchyard.messages.sql import AuditEvent, SqlAnswer
from switchyard.tracing import trace_id

CLOCK_SLACK = 5.0  # seconds read before the id's time: clocks of edge and server differ


@dataclass(frozen=True)
class Hop:
    """One thing that happened to the request, and when (Unix seconds)."""

    name: str
    at: float
    where: str
    detail: str = ""


@dataclass
class Trace:
    request_id: str
    trace_id: str | None = None
    tenant: str | None = None
    kind: str | None = None
    status: str | None = None
    hops: list[Hop] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)  # SQL: seconds per stage

    def ordered(self) -> list[Hop]:
        return sorted(self.hops, key=lambda h: h.at)

    def steps(self) -> list[tuple[Hop, float]]:
        """Each hop with the time since the one before (the first: 0)."""
        hops = self.ordered()
        return [(h, h.at - hops[i - 1].at if i else 0.0) for i, h in enumerate(hops)]

    @property
    def end_to_end(self) -> float:
        hops = self.ordered()
        return hops[-1].at - hops[0].at if hops else 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "tenant": self.tenant,
            "kind": self.kind,
            "status": self.status,
            "end_to_end": self.end_to_end,
            "hops": [
                {
                    "name": h.name,
                    "at": h.at,
                    "since_previous": d,
                    "where": h.where,
                    "detail": h.detail,
                }
                for h, d in self.steps()
            ],
            "stages": self.stages,
        }


def route_hops(route: Route, worker: str | None, prefix: str = "") -> list[Hop]:
    """The hops a result's route records, in the order they happen."""
    where = f"{route.pool}.p{route.partition}" if route.partition is not None else route.pool
    stamped = [
        ("prepared", route.prepared_at, "preprocessor", ""),
        ("admitted", route.admitted_at, "router", ""),
        ("dispatched", route.dispatched_at, "router", f"{where} -> {route.routed_to}"),
        ("started", route.started_at, worker or "worker", ""),
        ("first token", route.first_token_at, worker or "worker", ""),
        ("finished", route.finished_at, worker or "router", ""),
    ]
    return [Hop(prefix + name, at, by, detail) for name, at, by, detail in stamped if at]


async def find(js: JetStreamContext, request_id: str, *, window: float = 600.0) -> Trace:
    """The path of `request_id`, read from INGRESS, RES, AUDIT and DLQ."""
    try:
        born = id_time(request_id)
    except ValueError:
        raise SwitchyardError(
            f"{request_id!r} is not a Switchyard request id", code="invalid_request"
        ) from None
    span = Window(since=born - CLOCK_SLACK, until=born + window)
    trace = Trace(request_id)
    await _ingress(js, span, trace)
    await _results(js, span, trace)
    await _audit(js, span, trace)
    await _dead_letters(js, span, trace)
    if not trace.hops:
        raise SwitchyardError(
            f"nothing about request {request_id} in the streams between "
            f"{span.since:.0f} and {span.until:.0f}",
            code="invalid_request",
        )
    return trace


def _mine(trace: Trace, message: Envelope, request_id: str | None) -> bool:
    if request_id == trace.request_id:
        return True
    return trace.trace_id is not None and trace_id(message.trace) == trace.trace_id


async def _ingress(js: JetStreamContext, span: Window, trace: Trace) -> None:
    async with contextlib.aclosing(read(js, "INGRESS", span)) as stored_msgs:
        async for stored in stored_msgs:
            if stored.headers.get(MSG_ID) not in (None, trace.request_id):
                continue
            message = envelope_or_none(stored.data)
            if message is None or message.id != trace.request_id:
                continue
            trace.trace_id = trace_id(message.trace)
            trace.tenant, trace.kind = message.tenant, message.kind
            trace.hops.append(Hop("created", message.created_at, "client/edge", message.kind))
            trace.hops.append(Hop("stored", stored.time, "INGRESS", stored.subject))
            return


async def _results(js: JetStreamContext, span: Window, trace: Trace) -> None:
    calls = 0
    async for stored in read(js, "RES", _narrowed(span, "res", trace.tenant)):
        message = envelope_or_none(stored.data)
        if isinstance(message, GenerateResult) and _mine(trace, message, message.request_id):
            own = message.request_id == trace.request_id
            if not own:
                calls += 1
            prefix = "" if own else f"model call {calls}: "
            if own:
                trace.status = message.status
                trace.tenant = trace.tenant or message.tenant
            if message.route is not None:
                trace.hops.extend(route_hops(message.route, message.worker, prefix))
            detail = message.status if message.error is None else message.error.code
            trace.hops.append(Hop(prefix + "result stored", stored.time, "RES", detail))
        elif isinstance(message, SqlAnswer) and message.request_id == trace.request_id:
            trace.status = f"{message.status} ({message.path})"
            trace.stages = dict(message.stages)
            trace.hops.append(Hop("answered", message.created_at, "sqlflow", message.path))
            trace.hops.append(Hop("answer stored", stored.time, "RES", message.status))


async def _audit(js: JetStreamContext, span: Window, trace: Trace) -> None:
    async for stored in read(js, "AUDIT", _narrowed(span, "audit", trace.tenant)):
        message = envelope_or_none(stored.data)
        if isinstance(message, AuditEvent) and _mine(trace, message, message.request_id):
            detail = " ".join(x for x in (message.verdict, message.rule) if x)
            trace.hops.append(Hop(f"audit {message.event}", stored.time, message.actor, detail))


async def _dead_letters(js: JetStreamContext, span: Window, trace: Trace) -> None:
    async for stored in read(js, "DLQ", span):
        try:
            letter = decode(stored.data, DeadLetter)
        except DecodeError:
            continue
        if letter.request_id == trace.request_id:
            trace.hops.append(
                Hop(
                    "dead-lettered", stored.time, letter.consumer, f"{letter.code}: {letter.reason}"
                )
            )


def _narrowed(span: Window, family: str, tenant: str | None) -> Window:
    """The window restricted to the tenant's subjects once the tenant is known."""
    if tenant is None:
        return span
    return Window(subject=f"{family}.*.{tenant}", since=span.since, until=span.until)
