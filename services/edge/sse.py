"""Server-sent events in the shape OpenAI's clients parse: `data: <json>\n\n`, then `[DONE]`,
and the one loop that streams a request's reply as them (chat completions, SQL questions)."""

from __future__ import annotations

import contextlib
import json
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any, Generic

from pydantic import BaseModel

from services.edge.errors import ApiError
from services.edge.lifecycle import POLL, Flight
from switchyard.bus.reply import Final, Progress

HEADERS = {
    "Cache-Control": "no-cache",
    # Proxies (nginx) must not buffer a token stream.
    "X-Accel-Buffering": "no",
}
DONE = "data: [DONE]\n\n"
HEARTBEAT = ": keep-alive\n\n"  # a comment: clients ignore it, idle proxies see traffic


def event(payload: BaseModel | dict[str, Any]) -> str:
    if isinstance(payload, BaseModel):
        return f"data: {payload.model_dump_json()}\n\n"
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


class Render(ABC, Generic[Final]):
    """What a route's stream says: before the reply, for each progress item, for the
    final (storing it under the Idempotency-Key: `Flight.finish`), for an error."""

    def opening(self) -> list[str]:
        return []

    @abstractmethod
    def progress(self, item: Progress) -> str | None: ...

    @abstractmethod
    async def final(self, flight: Flight[Final], final: Final) -> list[str]: ...

    def error(self, error: ApiError, request_id: str) -> str:
        return event(error.body(request_id))


async def events(
    flight: Flight[Final], lifecycle: contextlib.AsyncExitStack,
    first: Progress | Final | None, render: Render[Final],
) -> AsyncIterator[str]:  # fmt: skip
    """The SSE body: `render`'s opening, an event per progress item, the final's, `[DONE]`;
    a heartbeat comment after each `sse_heartbeat` s of silence. The stream owns the
    request: its end (done, failed, client gone) leaves the `lifecycle`."""
    heartbeat = flight.state.settings.sse_heartbeat
    async with lifecycle:
        for part in render.opening():
            yield part
        item, silent_since = first, time.monotonic()
        while True:
            if item is None:
                if await flight.request.is_disconnected():
                    return  # leaving the lifecycle cancels the request
                if time.monotonic() - silent_since >= heartbeat:
                    silent_since = time.monotonic()
                    yield HEARTBEAT
            elif isinstance(item, Progress):
                silent_since = time.monotonic()
                if (said := render.progress(item)) is not None:
                    yield said
            else:
                for part in await render.final(flight, item):
                    yield part
                break
            try:
                item = await flight.next(POLL)
            except ApiError as exc:
                yield render.error(exc, flight.request_id)
                break
        yield DONE
