"""`sy replay`: select a window of a stream, show it, or send it again and compare.

Selection is a `Window` of one stream (time, sequence, subject filter) and optionally
a set of request ids. Sending again republishes each selected request with a new id
(a `Sy-Replay-Of` header remembers the original), a new trace, no reply inbox (results
are read from `RES`), and its deadline and frame time shifted by the same amount as its
creation time, so a step is exactly as fresh, relative to its budget, as it was.

Where to send: a sandbox — any fleet on another NATS server (`--to nats://...`), which
gets the topology provisioned and sees nothing of production — or the live subjects of
the source server (`--live`). Pace: the recorded gaps (`original`, optionally sped up)
or back to back (`fast`: the next request goes when one of `concurrency` in flight has
its result, so a burst the recording never had cannot make steps stale).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from switchyard import subjects
from switchyard.bus.streamread import Stored, Window, read
from switchyard.codec import encode, envelope_or_none
from switchyard.envelope import Envelope
from switchyard.ids import new_id
from switchyard.messages.agent import AgentStep
from switchyard.messages.inference import ChatRequest, GenerateResult
from switchyard.messages.sql import SqlAnswer, SqlAsk
from switchyard.tracing import new_traceparent, trace_id

REPLAY_OF = "Sy-Replay-Of"
Pace = Literal["original", "fast"]
Replayable = AgentStep | ChatRequest | SqlAsk
Outcome = GenerateResult | SqlAnswer


@dataclass(frozen=True)
class Selected:
    """One recorded request and where the stream kept it."""

    stored: Stored
    message: Replayable


async def select(
    js: JetStreamContext, window: Window, *, stream: str = "INGRESS",
    request_ids: Iterable[str] = (),
) -> AsyncIterator[tuple[Stored, Envelope | None]]:  # fmt: skip
    """The window's messages, decoded (None for what does not decode), in stream order."""
    wanted = set(request_ids)
    async for stored in read(js, stream, window):
        message = envelope_or_none(stored.data)
        if wanted and (message is None or _request_id(message) not in wanted):
            continue
        yield stored, message


def _request_id(message: Envelope) -> str:
    return getattr(message, "request_id", None) or message.id


def view(stored: Stored, message: Envelope | None) -> dict[str, Any]:
    """A message as `nats stream view` would show it, decoded to JSON (bytes summarised)."""
    body: Any
    if message is None:
        body = {
            "undecodable": base64.b64encode(stored.data[:64]).decode(),
            "bytes": len(stored.data),
        }
    else:
        body = _summarise(message.model_dump(mode="python"))
    return {
        "stream": stored.stream,
        "seq": stored.seq,
        "time": dt.datetime.fromtimestamp(stored.time, dt.UTC).isoformat(),
        "subject": stored.subject,
        "headers": stored.headers,
        "message": body,
    }


def _summarise(value: Any) -> Any:
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, dict):
        return {k: _summarise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_summarise(v) for v in value]
    return value


def replayable(selected: Iterable[tuple[Stored, Envelope | None]]) -> list[Selected]:
    """The requests a fleet can be asked again (client requests, not results or audit)."""
    return [
        Selected(stored, message)
        for stored, message in selected
        if isinstance(message, AgentStep | ChatRequest | SqlAsk)
    ]


def renewed(message: Replayable, now: float) -> Replayable:
    """The request as if sent at `now`: new id and trace, times shifted, no reply inbox."""
    shift = now - message.created_at
    update: dict[str, Any] = {
        "id": new_id(now),
        "created_at": now,
        "trace": new_traceparent(),
        "reply": None,
        "deadline": None if message.deadline is None else message.deadline + shift,
        "frame_ts": None if message.frame_ts is None else message.frame_ts + shift,
    }
    if isinstance(message, AgentStep) and message.sent_at is not None:
        update["sent_at"] = message.sent_at + shift  # its clock offset estimate unchanged
    return message.model_copy(update=update)


def temperature(message: Replayable) -> float:
    """The sampling temperature the request ran at (agent steps and SQL always use 0)."""
    return message.sampling.temperature if isinstance(message, ChatRequest) else 0.0


@dataclass
class Collected:
    """Results of the replayed requests as they arrive on the target's `res.>`."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    # SQL questions: the model calls made for them, by the question's trace id.
    calls: dict[str, list[GenerateResult]] = field(default_factory=dict)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_result(self, msg: Msg) -> None:
        self.add(msg.data)

    def add(self, data: bytes) -> None:
        message = envelope_or_none(data)
        if isinstance(message, SqlAnswer):
            self.outcomes[message.request_id] = message
        elif isinstance(message, GenerateResult):
            self.outcomes.setdefault(message.request_id, message)
            if (tid := trace_id(message.trace)) is not None:
                self.calls.setdefault(tid, []).append(message)
        self.arrived.set()

    async def wait_for(self, request_id: str, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while request_id not in self.outcomes:
            left = end - time.monotonic()
            if left <= 0:
                return False
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), min(left, 1.0))
            except TimeoutError:
                continue
        return True


@dataclass(frozen=True)
class Sent:
    original: Selected
    replay: Replayable


async def send(
    nc: Client, js: JetStreamContext, requests: list[Selected], *, pace: Pace = "fast",
    speed: float = 1.0, concurrency: int = 1, result_timeout: float = 120.0,
    progress: Any = None,
) -> tuple[list[Sent], Collected]:  # fmt: skip
    """Publish `requests` again on `js` and collect their results from `res.>`."""
    collected = Collected()
    sub = await nc.subscribe(subjects.RES_ALL, cb=collected.on_result)
    sent: list[Sent] = []
    slots = asyncio.Semaphore(concurrency)
    waiters: list[asyncio.Task[bool]] = []
    started = time.time()
    first = requests[0].stored.time if requests else 0.0
    try:
        for item in requests:
            if pace == "original":
                due = started + (item.stored.time - first) / speed
                await asyncio.sleep(max(0.0, due - time.time()))
            else:
                await slots.acquire()
            replay = renewed(item.message, time.time())
            subject = subjects.ingress_runnable(item.stored.subject)
            await js.publish(
                subject, encode(replay),
                headers={"Nats-Msg-Id": replay.id, "traceparent": replay.trace or "",
                         REPLAY_OF: item.message.id},
            )  # fmt: skip
            sent.append(Sent(item, replay))
            waiter = asyncio.create_task(collected.wait_for(replay.id, result_timeout))
            if pace == "fast":
                waiter.add_done_callback(lambda _: slots.release())
            if progress is not None:
                waiter.add_done_callback(lambda _: progress())
            waiters.append(waiter)
        await asyncio.gather(*waiters)
        await nc.flush()
    finally:
        await sub.unsubscribe()
    return sent, collected


async def recorded(
    js: JetStreamContext, requests: list[Selected], *, slack: float = 600.0
) -> Collected:
    """The results the source recorded in `RES` for `requests` (and their model calls)."""
    out = Collected()
    if not requests:
        return out
    times = [r.stored.time for r in requests]
    window = Window(since=min(times) - 1.0, until=max(times) + slack)
    wanted = {r.message.id for r in requests}
    async with contextlib.aclosing(read(js, "RES", window)) as stored_msgs:
        async for stored in stored_msgs:
            out.add(stored.data)
            if wanted <= out.outcomes.keys():
                break  # a question's model calls come before its answer: nothing more to find
    return out
