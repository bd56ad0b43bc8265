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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from switchyard import subjects
from switchyard.backoff import Backoff
from switchyard.bus.publish import MSG_ID, UNAVAILABLE
from switchyard.codec import encode
from switchyard.errors import DecodeError, ErrorCode, SwitchyardError
from switchyard.logging import get_logger
from switchyard.messages.deadletter import DeadLetter
from switchyard.metrics import DEAD_LETTERS

log = get_logger(__name__)

Handler = Callable[[Msg], Awaitable[None]]
# Called after a message is dead-lettered, so its requester can be told why.
GiveUp = Callable[[Msg, ErrorCode, str], Awaitable[None]]


# A failed message is held back by its stream from ~0.5 s, doubling, up to 30 s.
NAK_BACKOFF = Backoff(first=0.5, cap=30.0)


@dataclass(frozen=True)
class RetryPolicy:
    max_deliver: int  # the consumer's server-side max_deliver
    backoff: Backoff = NAK_BACKOFF

    def delay(self, delivered: int) -> float:
        """How long the stream holds a message back after delivery `delivered` failed."""
        return self.backoff.delay(delivered - 1)


# Pull-request status codes (JetStream sends them to the request's reply subject).
_HEARTBEAT = "100"
# How long a pull stays outstanding. Long, because an idle consumer costs one pull and one
# `408` per `expires` (a worker holds 64 of them) and nothing else: a stopped puller's pull
# does not linger (the server drops a waiting pull whose reply subject lost its interest;
# `tests/integration/test_bus.py` checks that on both NATS versions) and a reconnect
# re-pulls at once (`RECONNECT_CHECK`).
PULL_EXPIRES = 30.0
# A pull stays outstanding this much past its `expires` before it is presumed lost (its
# consumer was recreated, its server lost it without a reconnect) and asked again.
LOST_PULL_GRACE = 2.0
# How often an outstanding pull checks whether the connection reconnected since it was
# sent: a new server has no record of it, so it is asked again.
RECONNECT_CHECK = 0.5
# On a JetStream cluster a pull waits at the consumer's leader, which may be another
# server than ours: if that server dies, the pull dies with it and nothing tells us (the
# new leader never heard of it). So a pull asks for an idle heartbeat (`100`) this often
# while it waits, and one not heard from for two of them is presumed lost and asked again.
PULL_HEARTBEAT = 2.0
# After a refused or failed pull (no consumer yet, its leader moving, the bus away): how
# long before the next. Jittered, so a fleet's pullers that all heard the same
# leadership change do not all ask the new leader in the same millisecond.
PULL_RETRY = Backoff(first=1.0, cap=2.0)


class Puller:
    """A durable pull consumer read continuously: one pull request is kept outstanding
    for as many messages as the reader has `room()` for, each message is handed to
    `deliver` the moment it arrives, and the next pull goes out when that one is spent
    (every message it asked for delivered, or its `expires` ran out) and there is room.

    Why not nats-py's `fetch`: each fetch is a fresh request, a batch fetch can hold a
    message that arrived while it waits for the rest until the pull expires, and topping
    a batch up costs a no-wait request, a lingering one and two status replies per
    handful (most of the NATS server's work per request in `sy bench peers overhead`).
    Here a message costs the server one delivery.

    Each request has its own reply subject (`<inbox>.<n>`), so a late status of an
    earlier request (after a reconnect) never ends the current one. `stop()` drains the
    subscription: a message already on its way is still handed to `deliver`, and the
    server forgets the pull in flight with the interest in its reply subject.
    """

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        durable: str,
        deliver: Callable[[Msg], None],
        room: Callable[[], int],
        *,
        expires: float = PULL_EXPIRES,
        heartbeat: float = PULL_HEARTBEAT,
    ) -> None:
        self.nc = js._nc  # the connection the context publishes on
        self.next_subject = f"{js._prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.deliver = deliver
        self.room = room
        self.expires = expires
        self.heartbeat = heartbeat
        self._inbox = self.nc.new_inbox()
        self._request = 0  # the current request's number (its reply subject's last token)
        self._remaining = 0  # messages the current request may still deliver
        self._lost_at = 0.0  # monotonic: when the current request is presumed lost
        self._heard = 0.0  # monotonic: when the current request was last heard of
        self._reconnects = 0  # the connection's reconnect count when it was sent
        self._changed = asyncio.Event()
        self._stopping = False
        self._refused = False
        self._failures = 0  # refused or failed pulls since the last one that worked
        self._sub: Subscription | None = None

    def wake(self) -> None:
        """Room grew (a message was settled): pull again if the last request is spent."""
        self._changed.set()

    def stop(self) -> None:
        self._stopping = True
        self._changed.set()

    async def run(self) -> None:
        """Until `stop()` (or cancelled); then the subscription is drained."""
        self._sub = await self.nc.subscribe(f"{self._inbox}.*", cb=self._on_msg)
        try:
            while not self._stopping:
                now = time.monotonic()
                if self._remaining and (
                    now >= self._lost_at
                    or now - self._heard > 2 * self.heartbeat
                    or self.nc.stats["reconnects"] != self._reconnects
                ):
                    self._remaining = 0  # lost with its server or connection: ask again
                if not self._remaining:
                    if self._refused:  # the server said no (no consumer, ...): not in a spin
                        self._refused = False
                        await self._back_off()
                        continue
                    if (n := self.room()) > 0:
                        await self._pull(n)
                        continue
                self._changed.clear()
                wait = RECONNECT_CHECK if self._remaining else None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):  # a timer, not a task per wait
                        await self._changed.wait()
        finally:
            with contextlib.suppress(Exception):
                await self._sub.drain()  # type: ignore[no-untyped-call]

    async def _pull(self, batch: int) -> None:
        self._request += 1
        self._remaining = batch
        self._heard = time.monotonic()
        self._lost_at = self._heard + self.expires + LOST_PULL_GRACE
        self._reconnects = self.nc.stats["reconnects"]
        body = b'{"batch":%d,"expires":%d,"idle_heartbeat":%d}' % (
            batch, int(self.expires * 1e9), int(self.heartbeat * 1e9),
        )  # fmt: skip
        try:
            await self.nc.publish(self.next_subject, body, f"{self._inbox}.{self._request}")
        except UNAVAILABLE as exc:
            log.warning("bus.pull_failed", subject=self.next_subject, error=repr(exc))
            self._remaining = 0
            await self._back_off()

    async def _back_off(self) -> None:
        await asyncio.sleep(PULL_RETRY.delay(self._failures))
        self._failures += 1

    async def _on_msg(self, msg: Msg) -> None:
        current = msg.subject.rsplit(".", 1)[-1] == str(self._request)
        if current:
            self._heard = time.monotonic()
        status = (msg.headers or {}).get(api.Header.STATUS)
        if status in (None, _HEARTBEAT, "408"):  # the pull worked: the next refusal is news
            self._failures = 0
        if status is None:
            self._remaining = max(0, self._remaining - 1)
            if not self._remaining:
                self._changed.set()
            self.deliver(msg)
            return
        if status == _HEARTBEAT:
            return
        # 408 expired, 404/409 ended or refused: the request is spent if it is the current one.
        if current:
            self._remaining = 0
            self._changed.set()
        if status not in ("404", "408"):
            self._refused = True
            why = (msg.headers or {}).get(api.Header.DESCRIPTION) or ""
            # A consumer's leader moving (a JetStream cluster lost a node) is news, not
            # trouble: every consumer of the fleet says it at once.
            level = log.info if "Leadership Change" in why else log.warning
            level("bus.pull_status", subject=self.next_subject, status=status, description=why)


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
        drain_timeout: float = 30.0,
        on_give_up: GiveUp | None = None,
    ) -> None:
        self.js = js
        self.stream = stream
        self.durable = durable
        self.handler = handler
        self.retry = retry
        self.progress_every = max(0.05, ack_wait / 3)
        self.drain_timeout = drain_timeout
        self.on_give_up = on_give_up
        self._inflight: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._puller: Puller | None = None
        self._free = max_inflight
        self.processed = 0

    def stop(self) -> None:
        self._stopping.set()
        if self._puller is not None:
            self._puller.stop()

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    async def run(self) -> None:
        puller = Puller(self.js, self.stream, self.durable, self._start, lambda: self._free)
        self._puller = puller
        if self._stopping.is_set():
            puller.stop()
        try:
            await puller.run()
        except nats.errors.ConnectionClosedError:
            pass
        finally:
            await self._drain()

    def _start(self, msg: Msg) -> None:
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
        keepalive = _KeepAlive(msg, self.progress_every)
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
                    log.warning("bus.retry", consumer=self.durable, error=repr(exc),
                                delay=round(delay, 3))  # fmt: skip
                    await msg.nak(delay=delay)
                return
            await msg.ack()
            self.processed += 1
        except nats.errors.ConnectionClosedError:
            # Closed under it (a service stopping without its bus): the message was not
            # settled, so its stream hands it out again after its ack wait.
            log.warning("bus.unsettled", consumer=self.durable, subject=msg.subject)
        finally:
            keepalive.cancel()
            self._free += 1
            if self._puller is not None:
                self._puller.wake()

    async def _give_up(self, msg: Msg, code: ErrorCode, reason: str) -> None:
        await dead_letter(self.js, msg, code=code, reason=reason, consumer=self.durable)
        if self.on_give_up is not None:
            try:
                await self.on_give_up(msg, code, reason)
            except Exception as exc:  # the dead letter is stored; telling the caller is best effort
                log.warning("bus.give_up_hook_failed", error=repr(exc))


class _KeepAlive:
    """`in_progress()` for `msg` every `every` seconds until cancelled: a timer, not a task,
    so the many messages handled faster than `every` cost one timer each and nothing else."""

    def __init__(self, msg: Msg, every: float) -> None:
        self.msg = msg
        self.every = every
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(every, self._due)
        self._sending: asyncio.Task[None] | None = None

    def _due(self) -> None:
        self._sending = self._loop.create_task(self._send())
        self._handle = self._loop.call_later(self.every, self._due)

    async def _send(self) -> None:
        with contextlib.suppress(Exception):
            await self.msg.in_progress()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
