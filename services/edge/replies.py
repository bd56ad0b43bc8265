"""One request's reply stream: publish with a reply inbox, then read frames with timeouts.

The HTTP side waits for the next frame with a short timeout (to send SSE heartbeats or
watch for a client disconnect): `TokenStreamReader.next(timeout)` keeps its place across
such timeouts, so no pump task stands between the inbox and the route.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from fastapi import Response
from pydantic import BaseModel

from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.codec import encode
from switchyard.envelope import Envelope
from switchyard.messages.inference import Cancel, GenerateResult, TokenFrame

# How long a request waits for its streams to take it while a cluster elects a leader.
INGRESS_PATIENCE = 15.0


class Reply:
    def __init__(self, bus: Bus, *, idle_timeout: float) -> None:
        self.bus = bus
        self.reader = TokenStreamReader(bus.nc, idle_timeout=idle_timeout)
        self.request_id = ""
        self.tenant = ""
        self.finished = False  # an end or error frame was seen, or the stream broke

    async def start(self, sends: Sequence[tuple[str, Envelope]]) -> bool:
        """Open the inbox, then publish each `(subject, message)` with `reply` set to it,
        all at once (one request: the first runs it, the others record it), and wait for
        every stream's ack. False: the first one's stream already held a message with its
        id (and kept that one)."""
        await self.reader.__aenter__()
        self.request_id, self.tenant = sends[0][1].id, sends[0][1].tenant
        inbox = self.reader.inbox
        try:
            # Patient: while a stream elects a new leader the client waits seconds for its
            # answer instead of getting a 503 and retrying into the same election.
            acks = await asyncio.gather(
                *(publish(self.bus.js, subject, message.model_copy(update={"reply": inbox}),
                          patience=INGRESS_PATIENCE) for subject, message in sends)
            )  # fmt: skip
        except BaseException:
            await self.reader.__aexit__(None, None, None)
            raise
        return not acks[0].duplicate

    async def next(self, timeout: float | None) -> TokenFrame | None:
        """The next frame, or None if none arrived within `timeout` (the HTTP side then
        sends an SSE heartbeat or checks its client, and asks again: nothing is lost).
        Raises what broke the stream (`StreamTimeout`, ...)."""
        try:
            frame = await self.reader.next(timeout)
        except Exception:
            self.finished = True
            raise
        if frame is not None and frame.type != "delta":
            self.finished = True
        return frame

    async def cancel(self, reason: str = "client") -> None:
        """Tell the router and workers to stop (core NATS: fire and forget)."""
        msg = Cancel(tenant=self.tenant, request_id=self.request_id, reason=reason)

        await self.bus.nc.publish(subjects.cancel(self.request_id), encode(msg))
        await self.bus.nc.flush()

    async def close(self) -> None:
        await self.reader.__aexit__(None, None, None)


def server_timing(result: GenerateResult) -> dict[str, str]:
    """The `Server-Timing` header (W3C) of an answer: milliseconds per hop of its way
    through the fleet (`Route.hops`: prepare, to_router, router, to_worker, engine, back),
    for browsers' developer tools, `curl -i` and `sy bench peers`."""
    if result.route is None:
        return {}
    hops = result.route.hops(time.time())
    return {"Server-Timing": ", ".join(f"{h};dur={s * 1000:.2f}" for h, s in hops.items())}


def json_answer(answer: BaseModel, headers: Mapping[str, str] | None = None) -> Response:
    """`answer` as an `application/json` response, serialised by pydantic-core straight to
    bytes (what `JSONResponse(answer.model_dump())` makes, without the dict in between)."""
    return Response(answer.model_dump_json(), media_type="application/json", headers=headers)
