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
import collections
import contextlib
import time
import weakref
from collections.abc import AsyncIterator
from typing import Self

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from switchyard.codec import decode, encode
from switchyard.errors import DecodeError, StreamTimeout
from switchyard.messages.inference import ErrorInfo, GenerateResult, TokenFrame

# Deltas that come faster than this apart travel as one frame: the first of a burst goes at
# once (time to first token is untouched) and the rest of it at most this much later.
# Decode on a GPU is ~10-20 ms a token, so a live stream is not held back; a burst (a fast
# engine, a multi-token delta, an answer finishing) costs one message instead of one per
# token, each of which the NATS server routes and the reader decodes.
COALESCE_S = 0.005


class TokenStreamWriter:
    def __init__(
        self, nc: Client, inbox: str, *, attempt: int = 1, coalesce: float = COALESCE_S
    ) -> None:
        self.nc = nc
        self.inbox = inbox
        self.attempt = attempt
        self.coalesce = coalesce
        self.seq = 0
        self.closed = False
        self._held: list[str] = []  # delta text not sent yet
        self._held_tokens = 0
        self._sent_at = -coalesce  # monotonic time of the last delta frame
        self._due: asyncio.TimerHandle | None = None  # the held text's flush
        self._flushing: set[asyncio.Task[None]] = set()

    async def _send(self, frame: TokenFrame) -> None:
        if self.closed:
            raise RuntimeError("token stream already ended")
        self.seq += 1
        await self.nc.publish(
            self.inbox, encode(frame.model_copy(update={"attempt": self.attempt}))
        )

    async def delta(self, text: str, tokens: int = 1) -> None:
        """`text` and the number of output `tokens` it holds."""
        if self.closed:
            raise RuntimeError("token stream already ended")
        self._held.append(text)
        self._held_tokens += tokens
        if self._due is not None:
            return  # a flush is already due
        wait = self._sent_at + self.coalesce - time.monotonic()
        if wait <= 0:
            await self._flush()
        else:
            self._due = asyncio.get_running_loop().call_later(wait, self._flush_due)

    def _flush_due(self) -> None:
        self._due = None
        if self.closed:
            return
        task = asyncio.ensure_future(self._flush())
        self._flushing.add(task)  # held until done: the loop keeps weak references
        task.add_done_callback(self._flushing.discard)

    async def _flush(self) -> None:
        if self._due is not None:
            self._due.cancel()
            self._due = None
        if not self._held:
            return
        text, tokens = "".join(self._held), self._held_tokens
        self._held.clear()
        self._held_tokens = 0
        self._sent_at = time.monotonic()
        await self._send(
            TokenFrame(seq=self.seq, type="delta", text=text, tokens=tokens, at=time.time())
        )

    # No `nc.flush()` after the last frame (a PING/PONG round trip per request): the
    # connection writes in order, so the WORK ack that follows cannot overtake it.
    async def end(self, result: GenerateResult) -> None:
        await self._flush()
        await self._send(TokenFrame(seq=self.seq, type="end", result=result, at=time.time()))
        self.closed = True

    async def error(self, info: ErrorInfo) -> None:
        await self._flush()
        await self._send(TokenFrame(seq=self.seq, type="error", error=info, at=time.time()))
        self.closed = True


class _Inboxes:
    """Every reply inbox of one connection behind one wildcard subscription: a reader takes
    `<prefix>.<n>` and gets what arrives there. A subscription per request would cost the
    NATS server a SUB and an UNSUB (an interest-graph change) on every request, and the
    client a subscription task."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.prefix = nc.new_inbox()
        self.queues: dict[str, asyncio.Queue[Msg]] = {}
        self._next = 0
        self._sub: Subscription | None = None
        self._opening = asyncio.Lock()

    async def open(self, max_frames: int) -> tuple[str, asyncio.Queue[Msg]]:
        if self._sub is None:  # the first reader subscribes; the lock stops a second one
            async with self._opening:
                if self._sub is None:
                    self._sub = await self.nc.subscribe(
                        f"{self.prefix}.*", cb=self._route, pending_msgs_limit=-1
                    )
        self._next += 1
        token = str(self._next)
        queue: asyncio.Queue[Msg] = asyncio.Queue(max_frames)
        self.queues[token] = queue
        return f"{self.prefix}.{token}", queue

    def close(self, inbox: str) -> None:
        self.queues.pop(inbox.rsplit(".", 1)[-1], None)

    async def _route(self, msg: Msg) -> None:
        queue = self.queues.get(msg.subject.rsplit(".", 1)[-1])
        if queue is not None:  # else a late frame for a reader that has gone
            with contextlib.suppress(asyncio.QueueFull):  # past max_frames: dropped
                queue.put_nowait(msg)


_INBOXES: weakref.WeakKeyDictionary[Client, _Inboxes] = weakref.WeakKeyDictionary()


class Inbox:
    """One request's reply inbox on the connection's shared wildcard subscription: the
    messages that arrive there, in arrival order, and the idle clock (`StreamTimeout`
    once nothing came for `idle_timeout`; before the first message, for `first_timeout`
    when given: a request may wait its turn in a stream longer than its server, once it
    has it, may stay silent). Open it (`async with`), then publish the request with
    `reply=inbox.inbox`."""

    def __init__(
        self, nc: Client, *, idle_timeout: float, first_timeout: float | None = None,
        max_frames: int = 1_000_000,
    ) -> None:  # fmt: skip
        self.nc = nc
        self.inbox = ""  # set on entry
        self.idle_timeout = idle_timeout
        self.first_timeout = first_timeout
        self._heard_any = False
        self.max_frames = max_frames
        self._queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._inboxes = _INBOXES.get(nc) or _INBOXES.setdefault(nc, _Inboxes(nc))
        self._heard = time.monotonic()  # the last message (or the start): the idle clock

    async def __aenter__(self) -> Self:
        self.inbox, self._queue = await self._inboxes.open(self.max_frames)
        self._heard = time.monotonic()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._inboxes.close(self.inbox)

    async def message(self, timeout: float | None = None) -> Msg | None:
        """The next message, or None if none came within `timeout`; raises `StreamTimeout`
        once the inbox has been silent for `idle_timeout`. A timeout loses nothing."""
        if not self._queue.empty():
            self._heard, self._heard_any = time.monotonic(), True
            return self._queue.get_nowait()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            now = time.monotonic()
            limit = self.idle_timeout
            if not self._heard_any and self.first_timeout is not None:
                limit = self.first_timeout
            idle_left = self._heard + limit - now
            if idle_left <= 0:
                silent = f"{self.inbox} silent for {limit}s"
                raise StreamTimeout(f"reply inbox {silent} without an end-of-stream frame")
            wait = idle_left if deadline is None else min(idle_left, deadline - now)
            if wait <= 0:
                return None
            try:
                async with asyncio.timeout(wait):
                    msg = await self._queue.get()
            except TimeoutError:
                continue
            self._heard, self._heard_any = time.monotonic(), True
            return msg


class TokenStreamReader(Inbox):
    """A token stream's frames in order (`next(timeout)`: None, nothing yet; or
    `async for frame in reader`), across attempts; `reply.Reply` reads its final.

    `async with TokenStreamReader(nc, idle_timeout=5) as stream:` … `async for frame in stream`.
    """

    def __init__(
        self, nc: Client, *, idle_timeout: float, first_timeout: float | None = None,
        max_frames: int = 1_000_000,
    ) -> None:  # fmt: skip
        super().__init__(nc, idle_timeout=idle_timeout, first_timeout=first_timeout,
                         max_frames=max_frames)  # fmt: skip
        # In-order delivery across attempts (a request taken over by another worker).
        self._ready: collections.deque[TokenFrame] = collections.deque()
        self._held: dict[int, TokenFrame] = {}
        self._expected = 0
        self._attempt = 0
        self._yielded_chars = 0  # of delta text, across attempts
        self._replayed_chars = 0  # of the current attempt's delta text

    async def __aiter__(self) -> AsyncIterator[TokenFrame]:
        while True:
            frame = await self.next()
            if frame is None:  # pragma: no cover - next() without a timeout never says None
                continue
            yield frame
            if frame.type != "delta":
                return

    async def next(self, timeout: float | None = None) -> TokenFrame | None:
        """The next frame in order, or None if none is ready within `timeout`; raises
        `StreamTimeout` once the stream has been silent for `idle_timeout`. Safe to call
        again after None: a timeout loses nothing."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            msg = await self.message(left)
            if msg is None:
                return None
            self._take(msg)
        return self._ready.popleft()

    def _take(self, msg: Msg) -> None:
        """Order one arrived frame in; what is now in order goes to `_ready`."""
        try:
            frame = decode(msg.data, TokenFrame)
        except DecodeError as exc:
            frame = TokenFrame(
                seq=self._expected,
                type="error",
                error=ErrorInfo(code=exc.code, reason=f"undecodable frame: {exc.reason}"),
            )
        if frame.attempt < self._attempt:
            return  # a late frame of an attempt that was taken over
        if frame.attempt > self._attempt:
            self._attempt, self._expected, self._replayed_chars = frame.attempt, 0, 0
            self._held = {}
        self._held[frame.seq] = frame
        while self._expected in self._held:
            ready = self._held.pop(self._expected)
            self._expected += 1
            if ready.type == "delta":
                start = self._replayed_chars
                self._replayed_chars += len(ready.text)
                if self._replayed_chars <= self._yielded_chars:
                    continue  # already yielded by an earlier attempt
                text = ready.text[self._yielded_chars - start :]
                ready = ready.model_copy(update={"text": text})
                self._yielded_chars = self._replayed_chars
            self._ready.append(ready)
