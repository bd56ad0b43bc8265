"""Asking a question of the fleet: publish on `sql.in.<tenant>`, read stages, then the answer.

Used by the CLI, the HTTP edge, the evaluation harness and tests; anything else
can do the same with any NATS client (the messages are in `proto/`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

import nats.errors
from nats.aio.msg import Msg

from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.codec import decode_envelope
from switchyard.errors import DecodeError, StreamTimeout
from switchyard.messages.sql import SqlAnswer, SqlAsk, StageEvent


async def stream_answer(
    bus: Bus, ask: SqlAsk, *, idle_timeout: float = 120.0
) -> AsyncGenerator[StageEvent | SqlAnswer, None]:
    """Yield each stage event as it arrives, and last the answer.

    `idle_timeout` bounds the silence between two events (a model call on a busy
    CPU can take a while), not the whole question.
    """
    queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        queue.put_nowait(msg)

    inbox = bus.nc.new_inbox()
    sub = await bus.nc.subscribe(inbox, cb=on_msg)
    try:
        await publish(bus.js, subjects.sql_in(ask.tenant), ask.model_copy(update={"reply": inbox}))
        while True:
            try:
                msg = await asyncio.wait_for(queue.get(), idle_timeout)
            except TimeoutError:
                raise StreamTimeout(f"no word on question {ask.id} for {idle_timeout}s") from None
            event = decode_envelope(msg.data)
            if isinstance(event, SqlAnswer):
                yield event
                return
            if not isinstance(event, StageEvent):
                raise DecodeError(f"unexpected {event.kind} on a question's inbox", code="schema")
            yield event
    finally:
        # A caller that stops early may close the connection before this runs.
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


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
