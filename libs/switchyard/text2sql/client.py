"""Asking a question of the fleet: publish on `sql.in.<tenant>`, read stages, then the answer.

Used by the CLI, the evaluation harness, the load benches and tests (the HTTP edge reads
its questions' replies through its request lifecycle, on the same `bus.reply`); anything
else can do the same with any NATS client (the messages are in `proto/`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.reply import Reply
from switchyard.errors import StreamTimeout
from switchyard.messages.sql import SqlAnswer, SqlAsk, StageEvent


async def stream_answer(
    bus: Bus, ask: SqlAsk, *, idle_timeout: float = 120.0
) -> AsyncGenerator[StageEvent | SqlAnswer, None]:
    """Yield each stage event as it arrives, and last the answer.

    `idle_timeout` bounds the silence between two events (a model call on a busy
    CPU can take a while), not the whole question. The question is published
    patiently: a stream electing a leader makes it wait, not fail.
    """
    async with Reply(bus, SqlAnswer, idle_timeout=idle_timeout) as reply:
        await reply.start([(subjects.sql_in(ask.tenant), ask)])
        async for item in reply:
            if isinstance(item, StageEvent | SqlAnswer):
                yield item


async def ask_question(
    bus: Bus, tenant: str, question: str, *, idle_timeout: float = 120.0, **fields: Any
) -> tuple[list[StageEvent], SqlAnswer]:
    """The stage events and the answer of one question."""
    ask = SqlAsk(tenant=tenant, question=question, **fields)
    events: list[StageEvent] = []
    async for item in stream_answer(bus, ask, idle_timeout=idle_timeout):
        if isinstance(item, SqlAnswer):
            return events, item
        events.append(item)
    raise StreamTimeout(f"question {ask.id} ended without an answer")
