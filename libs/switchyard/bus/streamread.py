"""Reading a window of a JetStream stream, oldest first, without touching its consumers.

`sy replay`, `sy trace` and the review loop read what the streams kept: an ordered
(ephemeral, flow-controlled) consumer from a start time or sequence, until the window's
end, the stream's end at the time of the call, or a message limit.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from nats.js import JetStreamContext, api

# How long a read waits for the next message before deciding the stream has no more.
IDLE = 1.0


@dataclass(frozen=True)
class Stored:
    """One message as the stream kept it."""

    stream: str
    seq: int
    subject: str
    time: float  # when the stream stored it (Unix seconds, the server's clock)
    headers: dict[str, str]
    data: bytes


@dataclass(frozen=True)
class Window:
    """Which messages to read: a subject filter and a time and/or sequence range."""

    subject: str = ">"
    since: float | None = None  # Unix seconds
    until: float | None = None
    first_seq: int | None = None
    last_seq: int | None = None
    limit: int | None = None

    def config(self) -> api.ConsumerConfig:
        if self.first_seq is not None:
            return api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.first_seq
            )
        if self.since is not None:
            start = dt.datetime.fromtimestamp(self.since, dt.UTC)
            return api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_TIME, opt_start_time=start
            )
        return api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL)

    def past_end(self, msg: Stored) -> bool:
        return (self.until is not None and msg.time > self.until) or (
            self.last_seq is not None and msg.seq > self.last_seq
        )


async def read(js: JetStreamContext, stream: str, window: Window) -> AsyncGenerator[Stored]:
    """The stream's messages in `window`, in stream order."""
    info = await js.stream_info(stream)
    end_seq = info.state.last_seq  # messages stored after this call are not waited for
    if info.state.messages == 0:
        return
    sub = await js.subscribe(
        window.subject, stream=stream, ordered_consumer=True, config=window.config()
    )
    count = 0
    try:
        while window.limit is None or count < window.limit:
            try:
                msg = await sub.next_msg(timeout=IDLE)
            except TimeoutError:
                return
            meta = msg.metadata
            stored = Stored(
                stream=stream,
                seq=meta.sequence.stream,
                subject=msg.subject,
                time=meta.timestamp.timestamp(),
                headers=dict(msg.headers or {}),
                data=msg.data,
            )
            if window.past_end(stored):
                return
            count += 1
            yield stored
            if meta.num_pending == 0 or stored.seq >= end_seq:
                return
    finally:
        await sub.unsubscribe()
