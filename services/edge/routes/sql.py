"""`POST /v1/sql/ask`: a question for Text2SQL, its answer as JSON or SSE (see `edge.sql`)."""

from __future__ import annotations

import contextlib
import time
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from services.edge import sse
from services.edge.errors import API_ERRORS, Forbidden
from services.edge.idempotency import fingerprint
from services.edge.lifecycle import Replay, refusal, request_lifecycle
from services.edge.sql import (
    SQL_STATUS,
    SqlAnswerBody,
    SqlAskBody,
    SqlStream,
    answer_body,
    replayed_stream,
)
from services.edge.state import State, Who, request_id, traceparent
from switchyard.messages.sql import SqlAnswer

router = APIRouter(tags=["sql"])


@router.post(
    "/v1/sql/ask",
    response_model=SqlAnswerBody,
    responses={
        **API_ERRORS,
        200: {"content": {"text/event-stream": {}}, "description": "Answer or SSE"},
    },
)
async def sql_ask(
    body: SqlAskBody,
    request: Request,
    state: State,
    who: Who,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> Response:
    """A question -> its SQL, rows, summary and chart (or a clarifying question).

    `stream: true`: SSE `{"type": "stage"}` events and, every few seconds while the
    question is worked on, `{"type": "progress"}` keepalives; then `{"type": "answer"}`,
    then `[DONE]`. A retry with the same `Idempotency-Key` gets the first one's answer (the
    question runs once). Errors: 403 (`unknown_tenant`: no SQL policy), 400
    (`rejected_sql`), 429 `over_quota`, 503 `no_capacity` or `bus_unavailable` (with
    Retry-After), 504 (`expired`, or `timeout`: silence).
    """
    settings = state.settings
    if not who.may_use_pool(settings.sql_pool):
        raise Forbidden("this key may not use the sql pool")
    # The orchestrator answers `expired` to a question it reads after its deadline:
    # after `sql_timeout` the edge has stopped waiting for it to start (an idle
    # timeout from then on), so starting the question then would be work for nobody.
    ask = body.ask(
        who.tenant, request_id(request), time.time() + settings.sql_timeout,
        traceparent(request),
    )  # fmt: skip
    async with contextlib.AsyncExitStack() as lifecycle:
        flight = await lifecycle.enter_async_context(
            request_lifecycle(
                state, request, "sql", SqlAnswer, ask, key=idempotency_key,
                fingerprint=lambda: fingerprint(body.model_dump_json().encode()),
                idle_timeout=settings.sql_idle_timeout, statuses=SQL_STATUS,
                # Until the orchestrator takes it (it may queue in INGRESS): its deadline,
                # after which it is answered `expired`, not started.
                first_timeout=settings.sql_timeout,
            )
        )  # fmt: skip
        if isinstance(flight, Replay):
            return await replay(flight, body.stream)
        if not body.stream:
            answer = await flight.result()
            await flight.finish(answer)
            return JSONResponse(answer_body(answer))
        # Like a chat stream: a refusal arriving within the grace is a real HTTP status.
        first = await flight.first(settings.first_frame_grace)
        events = sse.events(flight, lifecycle.pop_all(), first, SqlStream())
        return StreamingResponse(events, media_type="text/event-stream", headers=sse.HEADERS)


async def replay(retry: Replay[SqlAnswer], stream: bool) -> Response:
    """A retried question (same tenant, same key): the original's answer, never a new run."""
    answer = await retry.result()
    if (err := refusal(answer, SQL_STATUS)) is not None:
        raise err
    if not stream:
        return JSONResponse(answer_body(answer), headers=retry.headers)
    return Response(
        replayed_stream(answer), media_type="text/event-stream",
        headers={**sse.HEADERS, **retry.headers},
    )  # fmt: skip
