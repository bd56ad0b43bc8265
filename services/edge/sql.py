"""`POST /v1/sql/ask`: a tenant's question for Text2SQL, and its answer as JSON or SSE.

The edge adds the tenant (from the API key, never the body), the request id and a
deadline, publishes a `SqlAsk` on `sql.in.<tenant>` and reads the orchestrator's
`StageEvent`s and final `SqlAnswer` from its reply inbox
(`switchyard.text2sql.client.stream_answer`). A stream renders each stage as
`data: {"type": "stage", ...}`, then `data: {"type": "answer", ...}`, then
`data: [DONE]`.

When the client goes away before the answer, the edge publishes
`cancel.<request id>`: sqlflow stops the question (and its model call) and answers
it `cancelled`, on `res.sql.<tenant>` like any other answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import anyio
from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from services.edge import sse
from services.edge.errors import ApiError, ClientGone, Unavailable
from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.codec import encode
from switchyard.errors import StreamTimeout, SwitchyardError
from switchyard.logging import get_logger
from switchyard.messages.inference import Cancel, ErrorInfo
from switchyard.messages.sql import (
    AnswerPath,
    Cell,
    Clarification,
    ResultFacts,
    SqlAnswer,
    SqlAsk,
    SqlText,
    StageEvent,
    StageName,
)
from switchyard.text2sql.client import stream_answer

log = get_logger(__name__)

POLL = 0.25  # s between disconnect checks while waiting for the next event
MAX_ROWS = 10_000  # the HTTP cap; the bus allows more, an HTTP body should not carry it

# What a client sees of a `SqlAnswer`: the outcome, not the envelope (ids, trace, reply).
ANSWER_FIELDS = {
    "request_id", "status", "path", "sql", "columns", "rows", "truncated", "summary",
    "summary_source", "facts", "chart", "clarification", "stages", "duration", "error",
}  # fmt: skip


class SqlAskBody(BaseModel):
    """A question. There is no `tenant` field: the tenant is the API key's."""

    model_config = ConfigDict(extra="forbid")

    question: Annotated[str, StringConstraints(min_length=1, max_length=4096)] = Field(
        description="the question, in natural language"
    )
    sql: SqlText | None = Field(
        default=None, description="your own SQL to validate (and correct once if needed)"
    )
    max_rows: int = Field(default=1000, ge=1, le=MAX_ROWS)
    no_cache: bool = Field(default=False, description="skip the answer and result caches")
    stream: bool = Field(default=False, description="stage events as SSE, then the answer")

    def ask(
        self, tenant: str, request_id: str, deadline: float, trace: str | None = None
    ) -> SqlAsk:
        return SqlAsk(
            id=request_id, tenant=tenant, question=self.question, fix_sql=self.sql,
            max_rows=self.max_rows, no_cache=self.no_cache, deadline=deadline, trace=trace,
        )  # fmt: skip


class SqlAnswerBody(BaseModel):
    """The answer (`status` ok or clarify; errors are HTTP errors, or an SSE event)."""

    request_id: str
    status: Literal["ok", "clarify", "rejected", "error"]
    path: AnswerPath
    sql: str | None = None
    columns: list[str] = []
    rows: list[list[Cell]] = []
    truncated: bool = False
    summary: str | None = None
    summary_source: Literal["template", "model"] | None = Field(
        default=None, description="template: written from `facts`; model: a checked rephrasing"
    )
    facts: ResultFacts | None = Field(
        default=None, description="the result's facts, computed from its rows without a model"
    )
    chart: dict[str, Any] | None = Field(default=None, description="Vega-Lite spec")
    clarification: Clarification | None = None
    stages: dict[str, float] = Field(default={}, description="seconds per stage")
    duration: float = 0.0
    error: ErrorInfo | None = None


class StageBody(BaseModel):
    """One SSE stage event (documentation of the stream's shape)."""

    type: Literal["stage"] = "stage"
    stage: StageName
    seconds: float
    data: dict[str, Any] = {}


def answer_body(answer: SqlAnswer) -> dict[str, Any]:
    return answer.model_dump(mode="json", include=ANSWER_FIELDS)


def stage_body(event: StageEvent) -> dict[str, Any]:
    return StageBody(stage=event.stage, seconds=event.seconds, data=event.data).model_dump(
        mode="json"
    )


def answer_failure(answer: SqlAnswer) -> ApiError | None:
    """The HTTP error of an answer that is not one (`error`, `rejected`), else None."""
    if answer.status in ("ok", "clarify"):
        return None
    info = answer.error or ErrorInfo(code="internal", reason=f"question {answer.status}")
    return ApiError.from_info(info)


def transport_error(exc: BaseException) -> ApiError:
    """Why no answer came: silence (504: the orchestrator is an upstream gone quiet), a
    typed fleet error, or a NATS failure (the question could not even be published)."""
    if isinstance(exc, StreamTimeout):
        return ApiError(504, exc.reason, "timeout_error", "timeout")
    if isinstance(exc, SwitchyardError):
        return ApiError.from_info(ErrorInfo(code=exc.code, reason=exc.reason[:1000]))
    log.warning("edge.sql.bus_error", error=repr(exc)[:200])
    return Unavailable("the question could not be sent")


class SqlReply:
    """One question's events, read with a timeout so the HTTP side can check the client
    (and send heartbeats) between them; a pump task owns the `stream_answer` iterator, so
    a timed-out wait never cancels it mid-message."""

    def __init__(self, bus: Bus, ask: SqlAsk, *, idle_timeout: float) -> None:
        self.bus = bus
        self.request_id = ask.id
        self.tenant = ask.tenant
        self.answered = False
        self._queue: asyncio.Queue[StageEvent | SqlAnswer | BaseException] = asyncio.Queue()
        self._pump = asyncio.create_task(self._run(bus, ask, idle_timeout))

    async def _run(self, bus: Bus, ask: SqlAsk, idle_timeout: float) -> None:
        try:
            async for item in stream_answer(bus, ask, idle_timeout=idle_timeout):
                self._queue.put_nowait(item)
        except Exception as exc:  # StreamTimeout, publish failures: items for the HTTP side
            self._queue.put_nowait(exc)

    async def next(self, timeout: float | None) -> StageEvent | SqlAnswer | None:
        """The next event or the answer, None if nothing came within `timeout`; raises
        what the pump hit."""
        try:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None
        if isinstance(item, BaseException):
            self.answered = True  # nothing more will come
            raise item
        if isinstance(item, SqlAnswer):
            self.answered = True
        return item

    async def close(self) -> None:
        """Stop listening (the pump's cancellation unsubscribes the inbox); a question
        left unanswered is cancelled, so sqlflow and the model stop working on it."""
        self._pump.cancel()
        with contextlib.suppress(BaseException):
            await self._pump
        if not self.answered:
            cancel = Cancel(tenant=self.tenant, request_id=self.request_id, reason="client")
            with contextlib.suppress(Exception):  # best effort: the connection may be gone
                await self.bus.nc.publish(subjects.cancel(self.request_id), encode(cancel))
                await self.bus.nc.flush()


async def wait_answer(reply: SqlReply, request: Request) -> SqlAnswer:
    """The answer, raising its HTTP error; stops waiting if the client goes away."""
    while True:
        try:
            item = await reply.next(POLL)
        except Exception as exc:
            raise transport_error(exc) from None
        if item is None:
            if await request.is_disconnected():
                raise ClientGone()
        elif isinstance(item, SqlAnswer):
            err = answer_failure(item)
            if err is not None:
                raise err
            return item


async def events(
    reply: SqlReply, request: Request, first: StageEvent | SqlAnswer | None, heartbeat: float
) -> AsyncIterator[str]:
    """The SSE body: stages, the answer (whatever its status), `[DONE]`; a heartbeat
    comment after each `heartbeat` s of silence (a model call on a busy CPU is slow)."""
    try:
        item, silent_since = first, time.monotonic()
        while True:
            if item is None:
                if await request.is_disconnected():
                    return  # the finally clause stops listening
                if time.monotonic() - silent_since >= heartbeat:
                    silent_since = time.monotonic()
                    yield sse.HEARTBEAT
            elif isinstance(item, StageEvent):
                silent_since = time.monotonic()
                yield sse.event(stage_body(item))
            else:
                yield sse.event({"type": "answer", **answer_body(item)})
                break
            try:
                item = await reply.next(POLL)
            except Exception as exc:
                yield sse.event({"type": "error", **transport_error(exc).body(reply.request_id)})
                break
        yield sse.DONE
    finally:
        with anyio.CancelScope(shield=True):
            await reply.close()
