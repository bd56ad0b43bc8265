"""Token streams over core NATS: ordered frames to a reply inbox, with an explicit end.

Core NATS (not JetStream) because a token is worthless a second later; what
must survive is the final result, which also goes to `RES`. The writer numbers
frames; the reader re-orders by `seq`, stops at the single `end` or `error`
frame, and raises `StreamTimeout` when the stream goes silent instead of
hanging forever on a lost end-of-stream.

When a request is taken over by another worker (a higher `attempt`), the reader
follows the new attempt and skips the text it already yielded, so a reader sees
one continuous stream. That is exact for deterministic decoding (temperature 0
with a seed, as agent steps run); otherwise the final `end` frame's result is
the authoritative text.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from types import TracebackType

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from switchyard.codec import decode, encode
from switchyard.errors import DecodeError, StreamTimeout
from switchyard.messages.inference import ErrorInfo, GenerateResult, TokenFrame


class TokenStreamWriter:
    def __init__(self, nc: Client, inbox: str, *, attempt: int = 1) -> None:
        self.nc = nc
        self.inbox = inbox
        self.attempt = attempt
        self.seq = 0
        self.closed = False

    async def _send(self, frame: TokenFrame) -> None:
        if self.closed:
            raise RuntimeError("token stream already ended")
        self.seq += 1
        await self.nc.publish(
            self.inbox, encode(frame.model_copy(update={"attempt": self.attempt}))
        )

    async def delta(self, text: str, tokens: int = 1) -> None:
        await self._send(
            TokenFrame(seq=self.seq, type="delta", text=text, tokens=tokens, at=time.time())
        )

    async def end(self, result: GenerateResult) -> None:
        await self._send(TokenFrame(seq=self.seq, type="end", result=result, at=time.time()))
        self.closed = True
        await self.nc.flush()

    async def error(self, info: ErrorInfo) -> None:
        await self._send(TokenFrame(seq=self.seq, type="error", error=info, at=time.time()))
        self.closed = True
        await self.nc.flush()


class TokenStreamReader:
    """Subscribe first, then publish the request with `reply=reader.inbox`.

    `async with TokenStreamReader(nc, idle_timeout=5) as stream:` … `async for frame in stream`.
    """

    def __init__(self, nc: Client, *, idle_timeout: float, max_frames: int = 1_000_000) -> None:
        self.nc = nc
        self.inbox = nc.new_inbox()
        self.idle_timeout = idle_timeout
        self.max_frames = max_frames
        self._queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._sub: Subscription | None = None

    async def __aenter__(self) -> TokenStreamReader:
        async def on_msg(msg: Msg) -> None:
            self._queue.put_nowait(msg)

        self._sub = await self.nc.subscribe(
            self.inbox, cb=on_msg, pending_msgs_limit=self.max_frames
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()

    async def __aiter__(self) -> AsyncIterator[TokenFrame]:
        expected = 0
        attempt = 0
        yielded_chars = 0  # of delta text, across attempts
        replayed_chars = 0  # of the current attempt's delta text
        held: dict[int, TokenFrame] = {}
        while True:
            try:
                msg = await asyncio.wait_for(self._queue.get(), self.idle_timeout)
            except TimeoutError:
                raise StreamTimeout(
                    f"token stream on {self.inbox} silent for {self.idle_timeout}s after "
                    f"{expected} frame(s) without an end-of-stream frame"
                ) from None
            try:
                frame = decode(msg.data, TokenFrame)
            except DecodeError as exc:
                frame = TokenFrame(
                    seq=expected,
                    type="error",
                    error=ErrorInfo(code=exc.code, reason=f"undecodable frame: {exc.reason}"),
                )
            if frame.attempt < attempt:
                continue  # a late frame of an attempt that was taken over
            if frame.attempt > attempt:
                attempt, expected, replayed_chars, held = frame.attempt, 0, 0, {}
            held[frame.seq] = frame
            while expected in held:
                ready = held.pop(expected)
                expected += 1
                if ready.type == "delta":
                    start, replayed_chars = replayed_chars, replayed_chars + len(ready.text)
                    if replayed_chars <= yielded_chars:
                        continue  # already yielded by an earlier attempt
                    ready = ready.model_copy(update={"text": ready.text[yielded_chars - start :]})
                    yielded_chars = replayed_chars
                yield ready
                if ready.type != "delta":
                    return
