"""The sim server's HTTP API: OpenAI chat completions over one `SimEngine`, as vLLM serves it.

Routes: `POST /v1/chat/completions` (streaming or not), `GET /v1/models`, `GET /health`,
`GET /metrics` (vLLM's metric names, see `metrics`), and three for benchmarks only:
`POST /sim/reset` (a cold engine), `GET /sim/timings` (the modelled timings of the
requests served since the last reset, each labelled with its calibration) and
`GET /sim/calibration` (the GPU preset and the figures the engine runs with).

The request and response shapes are the edge's (`switchyard.openai_compat`), so the
two OpenAI surfaces of the project validate the same way. The session a request belongs to
is its `X-Session-ID` header, else its `user` field (the engine only records it).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from switchyard.engines.base import Delta, EngineError, EngineRequest
from switchyard.engines.sim import SimSettings
from switchyard.messages.inference import ChatMessage, Image
from switchyard.openai_compat import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    CompletionUsage,
    FinishReason,
    ModelCard,
    ModelList,
    completion_id,
)
from switchyard.openai_compat import Delta as ChunkDelta
from switchyard.simserver.frames import split_frames
from switchyard.simserver.metrics import SimCollector
from switchyard.simserver.state import SimServerState

SESSION_HEADER = "x-session-id"
DEFAULT_MAX_TOKENS = 16


class BadRequest(ValueError):
    """A request the server refuses with 400 and this message."""


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    # OpenAI's error shape, which vLLM also answers with.
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}},
        status_code=status,
    )


def engine_request(body: ChatCompletionRequest, session: str | None) -> EngineRequest:
    """The engine's view of an OpenAI request; frame markers become images."""
    try:
        sampling = body.sampling(DEFAULT_MAX_TOKENS, cap=32_768)
        messages: list[ChatMessage] = []
        images: dict[str, Image] = {}
        for m in body.chat_messages(max_chars=1 << 20):
            text = m.content if isinstance(m.content, str) else "".join(
                p.text for p in m.content if p.type == "text"
            )  # fmt: skip
            parts, found = split_frames(text)
            images.update((img.hash, img) for img in found)
            content = parts if found else text
            messages.append(ChatMessage(role=m.role, content=content))
    except ValueError as e:
        raise BadRequest(str(e)) from e
    return EngineRequest(
        request_id=uuid.uuid4().hex,
        messages=tuple(messages),
        images=tuple(images.values()),
        sampling=sampling,
        constraint=body.constraint(),
        session=session,
    )


def _finish(delta: Delta) -> FinishReason:
    if delta.finish_reason in ("abort", "error"):
        raise EngineError(f"the engine ended the request with {delta.finish_reason}")
    return "length" if delta.finish_reason == "length" else "stop"


def _usage(delta: Delta) -> CompletionUsage:
    return CompletionUsage(
        prompt_tokens=delta.prompt_tokens,
        completion_tokens=delta.completion_tokens,
        total_tokens=delta.prompt_tokens + delta.completion_tokens,
    )


def create_app(settings: SimSettings, model: str = "sim") -> FastAPI:
    state = SimServerState(settings)
    registry = CollectorRegistry()
    registry.register(SimCollector(state, model))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state.engine.start()
        try:
            yield
        finally:
            await state.engine.close()  # the current one: a reset replaces it

    app = FastAPI(title="sy sim-server (a simulator of one vLLM engine)", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"{where}: {first.get('msg', 'invalid request')}")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> ModelList:
        # owned_by "vllm", as vLLM answers: gateways (smg) pick their vLLM handling from it.
        # The model id and the server's title still say it is a simulator.
        return ModelList(data=[ModelCard(id=model, created=0, owned_by="vllm")])

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/sim/reset")
    async def reset() -> PlainTextResponse:
        await state.reset()
        return PlainTextResponse("reset\n")

    @app.get("/sim/timings")
    async def timings() -> JSONResponse:
        return JSONResponse(state.timings_json())

    @app.get("/sim/calibration")
    async def calibration() -> JSONResponse:
        return JSONResponse(settings.calibration_info())

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        session = request.headers.get(SESSION_HEADER) or body.user
        try:
            req = engine_request(body, session)
        except BadRequest as e:
            return _error(400, str(e))
        engine = state.engine
        stream = engine.generate(req)
        try:  # refusals (too long, ...) become a 400, not a broken stream
            first = await anext(stream)
        except EngineError as e:
            await stream.aclose()
            return _error(400, str(e))
        created = int(time.time())
        cid = completion_id(req.request_id)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                _sse(state, req.request_id, cid, created, model, first, stream, include_usage),
                media_type="text/event-stream",
            )
        text, last = [first.text], first
        try:
            while last.finish_reason is None:
                last = await anext(stream)
                text.append(last.text)
            reason = _finish(last)
        except EngineError as e:
            return _error(500, str(e), "internal_error")
        finally:
            await stream.aclose()
        state.record(req.request_id, reason)
        return JSONResponse(
            ChatCompletion(
                id=cid, created=created, model=model,
                choices=[Choice(message=AssistantMessage(content="".join(text)),
                                finish_reason=reason)],
                usage=_usage(last),
            ).model_dump(mode="json")
        )  # fmt: skip

    return app


async def _sse(
    state: SimServerState,
    request_id: str,
    cid: str,
    created: int,
    model: str,
    first: Delta,
    stream: AsyncIterator[Delta],
    include_usage: bool,
) -> AsyncIterator[str]:
    def event(choices: list[ChunkChoice], usage: CompletionUsage | None = None) -> str:
        chunk = ChatCompletionChunk(
            id=cid, created=created, model=model, choices=choices, usage=usage
        )
        return f"data: {json.dumps(chunk.model_dump(mode='json', exclude_none=True))}\n\n"

    try:
        yield event([ChunkChoice(delta=ChunkDelta(role="assistant", content=""))])
        delta: Delta | None = first
        while delta is not None:
            if delta.text:
                yield event([ChunkChoice(delta=ChunkDelta(content=delta.text))])
            if delta.finish_reason is not None:
                reason = _finish(delta)
                state.record(request_id, reason)
                yield event([ChunkChoice(delta=ChunkDelta(), finish_reason=reason)])
                if include_usage:
                    yield event([], _usage(delta))
                break
            delta = await anext(stream)
        yield "data: [DONE]\n\n"
    except EngineError as e:
        error: dict[str, Any] = {"message": str(e), "type": "internal_error", "code": 500}
        yield f"data: {json.dumps({'error': error})}\n\n"
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
