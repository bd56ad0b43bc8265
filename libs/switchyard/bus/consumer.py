"""A pull-consumer loop with at-least-once semantics and nothing silently dropped.

- acks only after the handler succeeds;
- keeps a long job alive with `in_progress()` while the handler runs;
- naks with exponential backoff on a `TransientError` (or any unexpected error);
- dead-letters, with the reason, a payload that cannot be decoded (retrying it
  would never help) and a message on its last allowed delivery;
- on `stop()`, pulls nothing more, lets in-flight work finish within the drain
  timeout and hands back (naks) whatever did not, so another consumer takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from switchyard import subjects
from switchyard.bus.publish import MSG_ID
from switchyard.codec import encode
from switchyard.errors import DecodeError, ErrorCode, SwitchyardError
from switchyard.logging import get_logger
from switchyard.messages.deadletter import DeadLetter
from switchyard.metrics import DEAD_LETTERS

log = get_logger(__name__)

Handler = Callable[[Msg], Awaitable[None]]
# What a fetch raises while the server restarts: retried, never fatal to the loop.
UNAVAILABLE = (
    nats.js.errors.ServiceUnavailableError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
)
# Called after a message is dead-lettered, so its requester can be told why.
GiveUp = Callable[[Msg, ErrorCode, str], Awaitable[None]]


@dataclass(frozen=True)
class RetryPolicy:
    max_deliver: int  # the consumer's server-side max_deliver
    backoff_base: float = 0.5
    backoff_cap: float = 30.0

    def delay(self, delivered: int) -> float:
        return float(min(self.backoff_cap, self.backoff_base * 2 ** max(0, delivered - 1)))


# A top-up pull only asks for what the stream already holds: the server answers at once
# (or, with nothing there, after this long), never waiting for new messages.
TOP_UP_WAIT = 0.005


async def fetch_ready(
    sub: JetStreamContext.PullSubscription, room: Callable[[], int], timeout: float
) -> AsyncGenerator[list[Msg]]:
    """Pulled messages in two handfuls: one as soon as it is there, then up to `room()`
    more that the stream already holds. Start each handful before asking for the next.

    nats-py's fetch(n) can keep a message that arrived while it waits for the other n-1
    until the pull expires (lone messages: max wait 62 ms before, 2 ms after; see the #9
    note). Raises the fetch's timeout when nothing came within `timeout`.
    """
    yield await sub.fetch(1, timeout=timeout)
    if (n := room()) <= 0:
        return
    try:
        more = await sub.fetch(n, timeout=TOP_UP_WAIT)
    except (TimeoutError, nats.errors.TimeoutError):
        return
    yield more


async def dead_letter(
    js: JetStreamContext, msg: Msg, *, code: ErrorCode, reason: str, consumer: str
) -> None:
    """Store `msg` on `dlq.<subject>` with why it was given up, then terminate it."""
    meta = msg.metadata
    headers = {k: v for k, v in (msg.headers or {}).items() if len(k) <= 256 and len(v) <= 256}
    letter = DeadLetter(
        subject=msg.subject,
        stream=meta.stream,
        consumer=consumer,
        stream_seq=meta.sequence.stream,
        deliveries=meta.num_delivered,
        code=code,
        reason=reason[:4096],
        at=time.time(),
        headers=headers,
        payload=msg.data,
        request_id=(msg.headers or {}).get(MSG_ID),
    )
    # Dedupe on the stream sequence: a dead letter re-sent after a crash is stored once.
    await js.publish(
        subjects.dead_letter(msg.subject),
        encode(letter),
        headers={MSG_ID: f"dlq-{meta.stream}-{meta.sequence.stream}"},
    )
    await msg.term()
    DEAD_LETTERS.labels(meta.stream, code).inc()
    log.warning("bus.dead_letter", subject=msg.subject, code=code, reason=reason)


class PullLoop:
    """Runs `handler` for each message of one durable pull consumer."""

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        durable: str,
        handler: Handler,
        *,
        retry: RetryPolicy,
        ack_wait: float,
        max_inflight: int = 1,
        fetch_timeout: float = 1.0,
        drain_timeout: float = 30.0,
        on_give_up: GiveUp | None = None,
    ) -> None:
        self.js = js
        self.stream = stream
        self.durable = durable
        self.handler = handler
        self.retry = retry
        self.progress_every = max(0.05, ack_wait / 3)
        self.max_inflight = max_inflight
        self.fetch_timeout = fetch_timeout
        self.drain_timeout = drain_timeout
        self.on_give_up = on_give_up
        self._inflight: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._free = max_inflight
        self.processed = 0

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    async def run(self) -> None:
        sub = await self.js.pull_subscribe_bind(self.durable, stream=self.stream)
        try:
            while not self._stopping.is_set():
                # <= : a fetch can hand back more than asked (nats-py drains its whole
                # queue, e.g. late answers to pulls made before a reconnect).
                if self._free <= 0:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                try:
                    async for msgs in fetch_ready(sub, lambda: self._free, self.fetch_timeout):
                        self._start(msgs)
                except (TimeoutError, nats.errors.TimeoutError):
                    continue
                except nats.errors.ConnectionClosedError:
                    break
                except UNAVAILABLE as exc:
                    # The server is restarting or its JetStream is not up yet: nats-py
                    # reconnects by itself, so pull again after a pause instead of dying.
                    log.warning("bus.fetch_unavailable", consumer=self.durable, error=repr(exc))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), self.fetch_timeout)
                    continue
        finally:
            await self._drain()
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def _start(self, msgs: list[Msg]) -> None:
        for msg in msgs:
            self._free -= 1
            task = asyncio.create_task(self._handle(msg))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _drain(self) -> None:
        if not self._inflight:
            return
        pending = set(self._inflight)
        log.info("bus.draining", consumer=self.durable, inflight=len(pending))
        _, late = await asyncio.wait(pending, timeout=self.drain_timeout)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)

    async def _handle(self, msg: Msg) -> None:
        keepalive = asyncio.create_task(self._keep_alive(msg))
        try:
            delivered = msg.metadata.num_delivered
            if delivered >= self.retry.max_deliver:
                reason = f"gave up after {delivered - 1} unsuccessful deliveries"
                await self._give_up(msg, "internal", reason)
                return
            try:
                await self.handler(msg)
            except DecodeError as exc:
                await self._give_up(msg, exc.code, exc.reason)
                return
            except asyncio.CancelledError:
                # Drain ran out of time: hand the message back for another consumer.
                with contextlib.suppress(Exception):
                    await msg.nak()
                raise
            except Exception as exc:
                code: ErrorCode = exc.code if isinstance(exc, SwitchyardError) else "internal"
                if delivered + 1 >= self.retry.max_deliver:
                    reason = f"failed {delivered} time(s); last error: {exc!r}"
                    await self._give_up(msg, code, reason)
                else:
                    delay = self.retry.delay(delivered)
                    log.warning("bus.retry", consumer=self.durable, error=repr(exc), delay=delay)
                    await msg.nak(delay=delay)
                return
            await msg.ack()
            self.processed += 1
        finally:
            keepalive.cancel()
            self._free += 1
            self._wake.set()

    async def _give_up(self, msg: Msg, code: ErrorCode, reason: str) -> None:
        await dead_letter(self.js, msg, code=code, reason=reason, consumer=self.durable)
        if self.on_give_up is not None:
            try:
                await self.on_give_up(msg, code, reason)
            except Exception as exc:  # the dead letter is stored; telling the caller is best effort
                log.warning("bus.give_up_hook_failed", error=repr(exc))

    async def _keep_alive(self, msg: Msg) -> None:
        while True:
            await asyncio.sleep(self.progress_every)
            with contextlib.suppress(Exception):
                await msg.in_progress()
