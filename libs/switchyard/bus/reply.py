"""A request's reply, as every asker reads it: the edge, Text2SQL's model calls, the CLI.

A request goes out with a reply inbox (`Reply.start`: patiently, since while a stream
elects a leader the asker had rather wait seconds than fail) and its answer comes back
there in one of two shapes, one per kind of final:

- a `GenerateResult` ends a token stream: ordered `TokenFrame`s (`tokenstream`), deltas
  then one `end` (the result) or `error` frame;
- a `SqlAnswer` ends a question: its `StageEvent`s as they happen, a `StageProgress`
  every few seconds while it is worked on, then the answer.

`Reply[Final]` reads either on the connection's shared wildcard inbox: `next()` gives
each progress item (a delta frame, a stage, a keepalive) and then the final; an `error` frame raises
`Refused`, silence `StreamTimeout`. `cancel()` is the one `cancel.<request id>` publisher.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Generic, Self, TypeVar, get_args

from nats.aio.client import Client

from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import INGRESS_PATIENCE, publish
from switchyard.bus.tokenstream import Inbox, TokenStreamReader
from switchyard.codec import decode_envelope, encode
from switchyard.envelope import Envelope
from switchyard.errors import DecodeError, ErrorCode, SwitchyardError
from switchyard.messages.inference import Cancel, ErrorInfo, GenerateResult, TokenFrame
from switchyard.messages.sql import SqlAnswer, StageEvent, StageProgress

Final = TypeVar("Final", GenerateResult, SqlAnswer)
Progress = TokenFrame | StageEvent | StageProgress  # a delta frame, a stage, a keepalive

_CODES: frozenset[str] = frozenset(get_args(ErrorCode))


class Refused(SwitchyardError):
    """The reply's `error` frame: the fleet refused or failed the request (`info` keeps
    what the HTTP side needs of it, `retry_after` included)."""

    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(info.reason, code=info.code)
        self.info = info


def error_info(exc: SwitchyardError) -> ErrorInfo:
    """What `exc` (a refusal, a silent or undecodable reply) tells the asker."""
    if isinstance(exc, Refused):
        return exc.info
    return ErrorInfo(code=exc.code, reason=exc.reason[:1000])


def failure(final: GenerateResult | SqlAnswer) -> ErrorInfo | None:
    """Why `final` is not an answer, or None when it is one (a result `ok`; an answer
    `ok`, or a clarifying question back)."""
    if isinstance(final, SqlAnswer):
        if final.status in ("ok", "clarify"):
            return None
        return final.error or ErrorInfo(code="internal", reason=f"question {final.status}")
    if final.status == "ok":
        return None
    if final.error is not None:
        return final.error
    code: ErrorCode = final.status if final.status in _CODES else "internal"  # type: ignore[assignment]
    return ErrorInfo(code=code, reason=f"request {final.status}")


async def cancel(nc: Client, tenant: str, request_id: str, reason: str) -> None:
    """Tell the router, the workers and sqlflow to stop `request_id` (core NATS: fire and
    forget; flushed, since an asker that cancels is often about to go, but for a second at
    most: on a connection between servers the flush would wait nats-py's 10 s for nothing)."""
    message = Cancel(tenant=tenant, request_id=request_id, reason=reason)
    await nc.publish(subjects.cancel(request_id), encode(message))
    await nc.flush(timeout=1)


class Reply(Generic[Final]):
    """`async with Reply(bus, SqlAnswer, idle_timeout=…) as reply:` `await reply.start(…)`,
    then `next(timeout)` (None: nothing yet, ask again) or `async for item in reply`."""

    def __init__(
        self, bus: Bus, final: type[Final], *, idle_timeout: float,
        first_timeout: float | None = None,
    ) -> None:  # fmt: skip
        """`idle_timeout`: the longest silence; `first_timeout`, when given, the longest
        before the first item (`tokenstream.Inbox`)."""
        self.bus = bus
        self.final: type[Final] = final
        self._frames = (
            TokenStreamReader(bus.nc, idle_timeout=idle_timeout, first_timeout=first_timeout)
            if final is GenerateResult
            else Inbox(bus.nc, idle_timeout=idle_timeout, first_timeout=first_timeout)
        )
        self.request_id = self.tenant = ""
        self.finished = False  # the final (or an error frame) came, or the reply broke

    @property
    def inbox(self) -> str:
        return self._frames.inbox

    async def __aenter__(self) -> Self:
        await self._frames.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(
        self, sends: Sequence[tuple[str, Envelope]], *, patience: float = INGRESS_PATIENCE
    ) -> bool:
        """Open the inbox if it is not, then publish each `(subject, message)` with `reply`
        set to it, all at once (one request: the first runs it, the others record it),
        each tried for up to `patience` s through a leader election. False: the first
        one's stream already held a message with its id (and kept that one)."""
        if not self.inbox:
            await self.__aenter__()
        self.request_id, self.tenant = sends[0][1].id, sends[0][1].tenant
        try:
            acks = await asyncio.gather(
                *(publish(self.bus.js, subject, message.model_copy(update={"reply": self.inbox}),
                          patience=patience) for subject, message in sends)
            )  # fmt: skip
        except BaseException:
            await self.close()
            raise
        return not acks[0].duplicate

    async def next(self, timeout: float | None = None) -> Progress | Final | None:
        """The next progress item or the final, None if nothing came within `timeout`
        (a timeout loses nothing); raises `Refused`, `StreamTimeout`, `DecodeError`."""
        try:
            item = await self._next(timeout)
        except Exception:
            self.finished = True
            raise
        if isinstance(item, self.final):
            self.finished = True
        return item

    async def _next(self, timeout: float | None) -> Progress | Final | None:
        if isinstance(self._frames, TokenStreamReader):
            frame = await self._frames.next(timeout)
            if frame is None or frame.type == "delta":
                return frame
            if frame.type == "end" and frame.result is not None:
                return frame.result  # type: ignore[return-value]  # Final is GenerateResult
            raise Refused(frame.error or ErrorInfo(code="internal", reason="no result"))
        msg = await self._frames.message(timeout)
        if msg is None:
            return None
        item = decode_envelope(msg.data)
        if not isinstance(item, StageEvent | StageProgress | self.final):
            raise DecodeError(f"unexpected {item.kind} on a reply inbox", code="schema")
        return item

    async def __aiter__(self) -> AsyncIterator[Progress | Final]:
        while True:
            item = await self.next()
            if item is not None:
                yield item
                if isinstance(item, self.final):
                    return

    async def cancel(self, reason: str) -> None:
        await cancel(self.bus.nc, self.tenant, self.request_id, reason)

    async def close(self) -> None:
        await self._frames.__aexit__(None, None, None)
