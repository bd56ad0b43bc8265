"""OpenAI's API: `GET /v1/models` and `POST /v1/chat/completions` (JSON or SSE).

A chat request becomes a `ChatRequest`, prepared onto `req.llm.<tenant>` (tenant from the
API key, never the body), and the token frames coming back are rendered as an OpenAI chat
completion or as SSE chunks. A stream waits up to `first_frame_grace` for its first
frame before committing to a 200, so the router's refusals are real HTTP statuses.

The session key a request names (`X-Session-ID`, else `user`) becomes the envelope's
`session`, hashed with the tenant (`tenant_session`) so that two tenants' keys never
meet in the router.
"""

from __future__ import annotations

import contextlib
import time
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import StreamingResponse

from services.edge import metrics, sse
from services.edge.errors import API_ERRORS, ApiError, Forbidden
from services.edge.idempotency import fingerprint
from services.edge.lifecycle import Flight, Replay, refusal, request_lifecycle
from services.edge.replies import json_answer, server_timing
from services.edge.state import State, Who, request_id, traceparent
from switchyard.bus.reply import Progress
from switchyard.messages.inference import ChatRequest, GenerateResult, TokenFrame
from switchyard.openai_compat import (
    HEADER_DOC,
    SESSION_HEADER,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkChoice,
    CompletionUsage,
    Delta,
    FinishReason,
    InvalidSession,
    ModelCard,
    ModelList,
    completion,
    completion_id,
    finish_reason,
    requested_session,
    tenant_session,
    usage_of,
)

router = APIRouter(tags=["openai"])


@router.get("/v1/models", response_model=ModelList, responses=API_ERRORS)
async def models(state: State, who: Who) -> ModelList:
    served = state.settings.models
    return ModelList(data=[ModelCard(id=m) for m in served if who.may_use_model(m)])


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletion,
    responses={
        **API_ERRORS,
        200: {"content": {"text/event-stream": {}}, "description": "Completion or SSE"},
    },
)
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    state: State,
    who: Who,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
    # Declared for the OpenAPI document; read below with every value it came with.
    x_session_id: Annotated[
        str | None, Header(alias=SESSION_HEADER, description=HEADER_DOC)
    ] = None,
) -> Response:
    settings = state.settings
    if body.model not in settings.models:
        raise ApiError(404, f"model {body.model!r} does not exist", code="model_not_found")
    if not who.may_use_model(body.model) or not who.may_use_pool(settings.chat_pool):
        raise Forbidden(f"this key may not use model {body.model!r}")
    session = chat_session(request, who.tenant, body.user)
    try:
        chat = ChatRequest(
            id=request_id(request), tenant=who.tenant, session=session, model=body.model,
            messages=body.chat_messages(settings.max_message_chars),
            sampling=body.sampling(settings.default_max_tokens, settings.max_tokens_cap),
            constraint=body.constraint(), stream=bool(body.stream),
            deadline=time.time() + settings.request_timeout, trace=traceparent(request),
        )  # fmt: skip
    except ValueError as exc:
        raise ApiError(422, str(exc).splitlines()[0] if str(exc) else "invalid") from None

    async with contextlib.AsyncExitStack() as lifecycle:
        flight = await lifecycle.enter_async_context(
            request_lifecycle(
                state, request, "llm", GenerateResult, chat, key=idempotency_key,
                fingerprint=lambda: fingerprint(body.model_dump_json().encode()),
            )
        )  # fmt: skip
        if isinstance(flight, Replay):
            return await replay(flight, body)
        if not body.stream:
            result = await flight.result()
            await flight.finish(result)
            metrics.completion_tokens(who.tenant, result.usage.completion_tokens)
            answer = completion(flight.request_id, body.model, result)
            return json_answer(answer, server_timing(result))
        first = await flight.first(settings.first_frame_grace)
        # From here the stream owns the request: its end (done, failed, client gone)
        # runs the lifecycle's clean-up, not this function's return.
        events = sse.events(flight, lifecycle.pop_all(), first, ChatStream(flight, body))
        return StreamingResponse(events, media_type="text/event-stream", headers=sse.HEADERS)


def chat_session(request: Request, tenant: str, user: str | None) -> str | None:
    """The envelope's `session` for this request, or None when it names no session key.

    A bad key is a 422 `invalid_session` naming the header or `user`, the edge's status
    for every other invalid field too."""
    try:
        key = requested_session(request.headers.getlist(SESSION_HEADER), user)
    except InvalidSession as exc:
        raise ApiError(422, str(exc), code="invalid_session", param=exc.param) from None
    return None if key is None else tenant_session(tenant, key)


class _Chunks:
    """The chunks of one streamed completion (one id and `created` for all of them)."""

    def __init__(self, request_id: str, model: str) -> None:
        self.id, self.created, self.model = completion_id(request_id), int(time.time()), model

    def event(
        self,
        delta: Delta,
        reason: FinishReason | None = None,
        usage: CompletionUsage | None = None,
    ) -> str:
        return sse.event(self.chunk(delta, reason, usage))

    def chunk(
        self,
        delta: Delta,
        reason: FinishReason | None = None,
        usage: CompletionUsage | None = None,
    ) -> ChatCompletionChunk:
        # The usage chunk has no choices, as OpenAI sends it.
        choices = [] if usage is not None else [ChunkChoice(delta=delta, finish_reason=reason)]
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )


class ChatStream(sse.Render[GenerateResult]):
    """A streamed completion: a role chunk, a chunk per delta, the finish (and usage)
    chunk."""

    def __init__(self, flight: Flight[GenerateResult], body: ChatCompletionRequest) -> None:
        self.chunks = _Chunks(flight.request_id, body.model)
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def opening(self) -> list[str]:
        return [self.chunks.event(Delta(role="assistant", content=""))]

    def progress(self, item: Progress) -> str | None:
        text = item.text if isinstance(item, TokenFrame) else ""
        return self.chunks.event(Delta(content=text)) if text else None

    async def final(self, flight: Flight[GenerateResult], final: GenerateResult) -> list[str]:
        try:
            result = flight.check(final)
        except ApiError as exc:
            return [self.error(exc, flight.request_id)]
        await flight.finish(result)
        metrics.completion_tokens(flight.tenant, result.usage.completion_tokens)
        parts = [self.chunks.event(Delta(), finish_reason(result))]
        if self.include_usage:
            parts.append(self.chunks.event(Delta(), usage=usage_of(result)))
        return parts


async def replay(retry: Replay[GenerateResult], body: ChatCompletionRequest) -> Response:
    """A retry with a known Idempotency-Key: the original's result, never a new run."""
    result = await retry.result()
    if (err := refusal(result)) is not None:
        raise err
    rid = retry.original.request_id
    if not body.stream:
        return json_answer(completion(rid, body.model, result), retry.headers)
    return Response(
        replayed_stream(rid, body, result),
        media_type="text/event-stream",
        headers={**sse.HEADERS, **retry.headers},
    )


def replayed_stream(request_id: str, body: ChatCompletionRequest, result: GenerateResult) -> str:
    """A finished result as a whole SSE body: all of its text in one delta."""
    chunks = _Chunks(request_id, body.model)
    parts = [
        chunks.chunk(Delta(role="assistant", content=result.text)),
        chunks.chunk(Delta(), finish_reason(result)),
    ]
    if body.stream_options and body.stream_options.include_usage:
        parts.append(chunks.chunk(Delta(), usage=usage_of(result)))
    return "".join(sse.event(p) for p in parts) + sse.DONE
