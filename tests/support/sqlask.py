"""Asking the fleet one Text2SQL question and waiting for its whole answer (the tests'
way; the CLI and the benches stream it with `text2sql.client.stream_answer`)."""

from __future__ import annotations

from typing import Any

from switchyard.bus.connection import Bus
from switchyard.errors import StreamTimeout
from switchyard.messages.sql import FIRST_TIMEOUT, IDLE_TIMEOUT, SqlAnswer, SqlAsk, StageEvent
from switchyard.text2sql.client import stream_answer


async def ask_question(
    bus: Bus, tenant: str, question: str, *, idle_timeout: float = IDLE_TIMEOUT,
    first_timeout: float = FIRST_TIMEOUT, **fields: Any,
) -> tuple[list[StageEvent], SqlAnswer]:  # fmt: skip
    """The stage events (keepalives left out: they end no stage) and the answer of one
    question."""
    ask = SqlAsk(tenant=tenant, question=question, **fields)
    events: list[StageEvent] = []
    async for item in stream_answer(bus, ask, idle_timeout=idle_timeout,
                                    first_timeout=first_timeout):  # fmt: skip
        if isinstance(item, SqlAnswer):
            return events, item
        if isinstance(item, StageEvent):
            events.append(item)
    raise StreamTimeout(f"question {ask.id} ended without an answer")
