"""Asking a question of the fleet: publish on `sql.in.<tenant>`, read stages, then the answer.

Used by the CLI, the load benches and tests (the HTTP edge reads
its questions' replies through its request lifecycle, on the same `bus.reply`); anything
else can do the same with any NATS client (the messages are in `proto/`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.reply import Reply
from switchyard.messages.sql import (
    FIRST_TIMEOUT,
    IDLE_TIMEOUT,
    SqlAnswer,
    SqlAsk,
    StageEvent,
    StageProgress,
)


async def stream_answer(
    bus: Bus, ask: SqlAsk, *, idle_timeout: float = IDLE_TIMEOUT,
    first_timeout: float = FIRST_TIMEOUT,
) -> AsyncGenerator[StageEvent | StageProgress | SqlAnswer, None]:  # fmt: skip
    """Yield each stage event and keepalive (`StageProgress`) as it arrives, and last the
    answer.

    `idle_timeout` bounds the silence between two of them, not the whole question: the
    orchestrator's keepalives go on however long a stage takes, so `StreamTimeout` means
    it stopped or cannot be reached. `first_timeout` bounds the wait for the first (the
    orchestrator says so as it takes the question; until then it may queue). The question
    is published patiently: a stream electing a leader makes it wait, not fail.
    """
    first = max(first_timeout, idle_timeout)  # (an explicit longer idle_timeout holds too)
    async with Reply(bus, SqlAnswer, idle_timeout=idle_timeout, first_timeout=first) as reply:
        await reply.start([(subjects.sql_in(ask.tenant), ask)])
        async for item in reply:
            if isinstance(item, StageEvent | StageProgress | SqlAnswer):
                yield item
