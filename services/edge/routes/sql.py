"""`POST /v1/sql/ask`: a question for Text2SQL, its answer as JSON or SSE (see `edge.sql`)."""

from __future__ import annotations

import time

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from services.edge import sse
from services.edge.errors import API_ERRORS, ApiError, Forbidden
from services.edge.sql import (
    SqlAnswerBody,
    SqlAskBody,
    SqlReply,
    answer_body,
    answer_failure,
    events,
    transport_error,
    wait_answer,
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
async def sql_ask(body: SqlAskBody, request: Request, state: State, who: Who) -> Response:
    """A question -> its SQL, rows, summary and chart (or a clarifying question).

    `stream: true`: SSE `{"type": "stage"}` events, then `{"type": "answer"}`, then
    `[DONE]`. Errors: 403 (`unknown_tenant`: no SQL policy), 400 (`rejected_sql`),
    429 `over_quota`, 503 `no_capacity`, 504 (`expired`, or `timeout`: silence).
    """
    settings = state.settings
    if not who.may_use_pool(settings.sql_pool):
        raise Forbidden("this key may not use the sql pool")
    # The orchestrator answers `expired` to a question it reads after its deadline:
    # after `sql_timeout` of silence the edge has stopped listening, so starting
    # the question then would be work for nobody.
    ask = body.ask(
        who.tenant, request_id(request), time.time() + settings.sql_timeout,
        traceparent(request),
    )  # fmt: skip
    reply = SqlReply(state.bus, ask, idle_timeout=settings.sql_timeout)
    if not body.stream:
        try:
            return JSONResponse(answer_body(await wait_answer(reply, request)))
        finally:
            with anyio.CancelScope(shield=True):
                await reply.close()
    try:
        # Like a chat stream: a refusal arriving within the grace is a real HTTP status.
        first = await reply.next(settings.first_frame_grace)
        if isinstance(first, SqlAnswer) and (err := answer_failure(first)) is not None:
            raise err
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            await reply.close()
        if isinstance(exc, Exception) and not isinstance(exc, ApiError):
            raise transport_error(exc) from None
        raise
    stream = events(reply, request, first, settings.sse_heartbeat)
    return StreamingResponse(stream, media_type="text/event-stream", headers=sse.HEADERS)
