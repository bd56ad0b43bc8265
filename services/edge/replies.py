"""One request's reply stream: publish with a reply inbox, then read frames with timeouts.

A pump task drains the `TokenStreamReader` into a queue so the HTTP side can
wait for the next frame with a short timeout (to send SSE heartbeats or watch
for a client disconnect) without cancelling the reader mid-frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.codec import encode
from switchyard.envelope import Envelope
from switchyard.messages.inference import Cancel, GenerateResult, TokenFrame

_Item = TokenFrame | BaseException


class Reply:
    def __init__(self, bus: Bus, *, idle_timeout: float) -> None:
        self.bus = bus
        self.reader = TokenStreamReader(bus.nc, idle_timeout=idle_timeout)
        self.request_id = ""
        self.tenant = ""
        self.finished = False  # an end or error frame was seen
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None

    async def start(self, subject: str, message: Envelope) -> None:
        """Subscribe, then publish `message` with `reply` set to our inbox."""
        await self.reader.__aenter__()
        self.request_id, self.tenant = message.id, message.tenant
        sent = message.model_copy(update={"reply": self.reader.inbox})
        try:
            await publish(self.bus.js, subject, sent)
        except BaseException:
            await self.reader.__aexit__(None, None, None)
            raise
        self._pump = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for frame in self.reader:
                self._queue.put_nowait(frame)
        except Exception as exc:  # StreamTimeout and friends reach the HTTP side as items
            self._queue.put_nowait(exc)

    async def next(self, timeout: float | None) -> TokenFrame | None:
        """The next frame, or None if none arrived within `timeout`. Raises a pump error."""
        try:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.type != "delta":
            self.finished = True
        return item

    async def cancel(self, reason: str = "client") -> None:
        """Tell the router and workers to stop (core NATS: fire and forget)."""
        msg = Cancel(tenant=self.tenant, request_id=self.request_id, reason=reason)

        await self.bus.nc.publish(subjects.cancel(self.request_id), encode(msg))
        await self.bus.nc.flush()

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(BaseException):
                await self._pump
        await self.reader.__aexit__(None, None, None)


def server_timing(result: GenerateResult) -> dict[str, str]:
    """The `Server-Timing` header (W3C) of an answer: milliseconds per hop of its way
    through the fleet (`Route.hops`: prepare, to_router, router, to_worker, engine, back),
    for browsers' developer tools, `curl -i` and `sy bench peers`."""
    if result.route is None:
        return {}
    hops = result.route.hops(time.time())
    return {"Server-Timing": ", ".join(f"{h};dur={s * 1000:.2f}" for h, s in hops.items())}
