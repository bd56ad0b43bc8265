"""The edge's FastAPI app: authenticate, validate, publish to the fleet, stream the reply.

It never runs a model: a chat request becomes a `ChatRequest` on `llm.in.<tenant>`
(tenant from the API key, never the body) with a reply inbox, and the token
frames coming back are rendered as an OpenAI chat completion or SSE chunks.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import Depends, FastAPI, Header, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.edge import metrics, sse
from services.edge.agent import (
    AGENT_STATUS,
    AgentStepResponse,
    StepInput,
    agent_failure,
    check_frames,
    openapi_request_body,
    parse_json,
    parse_multipart,
    response_of,
)
from services.edge.auth import KeyRing, Principal
from services.edge.console import mount_console
from services.edge.errors import ApiError
from services.edge.idempotency import Claim, Idempotency, fingerprint
from services.edge.middleware import EdgeMiddleware
from services.edge.openai_compat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkChoice,
    Delta,
    ModelCard,
    ModelList,
    completion,
    completion_id,
    finish_reason,
    usage_of,
)
from services.edge.replies import Reply
from services.edge.settings import EdgeSettings
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
from switchyard import subjects
from switchyard.bus.connection import Bus, connect
from switchyard.codec import decode
from switchyard.errors import SwitchyardError
from switchyard.logging import get_logger
from switchyard.messages.agent import AgentStep, RawFrame
from switchyard.messages.fleet import WorkerHeartbeat
from switchyard.messages.inference import (
    ChatRequest,
    ErrorInfo,
    GenerateResult,
    TokenFrame,
    Workload,
)
from switchyard.messages.sql import SqlAnswer

log = get_logger(__name__)

STREAMS = ("INGRESS", "REQ", "WORK", "RES")
POLL = 0.25  # s between disconnect checks while waiting for frames

_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
                "request_id": {"type": ["string", "null"]},
            },
            "required": ["message", "type"],
        }
    },
    "required": ["error"],
}
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"description": desc, "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
    for code, desc in [
        (400, "Invalid request"), (401, "Missing or unknown API key"),
        (403, "Key not allowed this model"), (404, "Unknown model"),
        (408, "Queued too long"), (409, "Agent frame stale (code `stale`)"),
        (413, "Body or frame too large"), (422, "Validation error"),
        (429, "Over quota (see Retry-After)"), (503, "No capacity"), (504, "Deadline passed"),
    ]
}  # fmt: skip


async def principal(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    """The caller, from the Bearer key; a dependency, so it runs before body validation."""
    keys: KeyRing = request.app.state.keys
    return keys.authenticate(authorization)


Who = Annotated[Principal, Depends(principal)]


def create_app(settings: EdgeSettings, bus: Bus | None = None) -> FastAPI:
    """The app; with `bus` it uses that connection (tests), else it connects on start-up."""
    keys = KeyRing.load(settings.api_keys_file)
    state: dict[str, Any] = {"bus": bus}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        own = state["bus"] is None
        if own:
            state["bus"] = await connect(settings, "edge")
        state["idem"] = Idempotency(state["bus"])
        try:
            yield
        finally:
            if own:  # forget it too, so a restarted lifespan connects afresh
                bus_, state["bus"] = state["bus"], None
                await bus_.close()

    app = FastAPI(
        title="Switchyard edge",
        version="1",
        description="OpenAI-compatible HTTP edge of the Switchyard fleet.",
        lifespan=lifespan,
    )
    app.state.keys = keys
    mount_console(app, settings, lambda: state["bus"])
    app.add_middleware(
        EdgeMiddleware,
        max_body_bytes=settings.max_body_bytes,
        path_caps={"/v1/agent/step": settings.max_agent_body_bytes},
    )

    def request_id(request: Request) -> str | None:
        return getattr(request.state, "request_id", None)

    def trace(request: Request) -> str | None:
        return getattr(request.state, "traceparent", None)

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
        rid = request_id(request)
        if exc.status >= 500:
            log.warning("edge.error", status=exc.status, code=exc.code, reason=exc.message)
        return JSONResponse(exc.body(rid), exc.status, headers=exc.headers(rid))

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own refusals (unparseable JSON body, unknown route, wrong method) in
        # OpenAI's error shape with the request id, like every other error.
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        err = ApiError(exc.status_code, str(exc.detail), kind)
        response = await on_api_error(request, err)
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        err = ApiError(422, f"{where}: {first.get('msg', 'invalid request')}", param=where or None)
        return await on_api_error(request, err)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"], responses={503: {"description": "Not ready"}})
    async def readyz(pool: str | None = None) -> JSONResponse:
        checks = await readiness(state["bus"], pool or settings.chat_pool)
        ok = all(bool(v) for v in checks.values())
        return JSONResponse({"ready": ok, **checks}, 200 if ok else 503)

    @app.get("/metrics", tags=["ops"], response_class=Response)
    async def prometheus() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=ModelList, responses=ERRORS, tags=["openai"])
    async def models(who: Who) -> ModelList:
        return ModelList(data=[ModelCard(id=m) for m in settings.models if who.may_use_model(m)])

    @app.post(
        "/v1/chat/completions",
        response_model=ChatCompletion,
        responses={
            **ERRORS,
            200: {"content": {"text/event-stream": {}}, "description": "Completion or SSE"},
        },
        tags=["openai"],
    )
    async def chat_completions(
        body: ChatCompletionRequest,
        request: Request,
        who: Who,
        idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
    ) -> Response:
        if body.model not in settings.models:
            raise ApiError(404, f"model {body.model!r} does not exist", code="model_not_found")
        if not who.may_use_model(body.model) or not who.may_use_pool(settings.chat_pool):
            raise ApiError(403, f"this key may not use model {body.model!r}", "permission_error")
        rid = request_id(request) or ""
        try:
            chat = ChatRequest(
                id=rid, tenant=who.tenant, model=body.model,
                messages=body.chat_messages(settings.max_message_chars),
                sampling=body.sampling(settings.default_max_tokens, settings.max_tokens_cap),
                constraint=body.constraint(), stream=bool(body.stream),
                deadline=time.time() + settings.request_timeout, trace=trace(request),
            )  # fmt: skip
        except ValueError as exc:
            raise ApiError(422, str(exc).splitlines()[0] if str(exc) else "invalid") from None

        idem: Idempotency = state["idem"]
        mine: Claim | None = None
        if idempotency_key:
            mine = Claim(request_id=rid, fingerprint=fingerprint(body.model_dump_json().encode()))
            claim, ours = await idem.claim(who.tenant, idempotency_key, mine)
            if not ours:
                return await replay(idem, who, idempotency_key, claim, mine, body)

        reply = Reply(state["bus"], idle_timeout=settings.idle_timeout)
        await reply.start(subjects.llm_in(who.tenant), chat)
        key = idempotency_key
        try:
            if not body.stream:
                result = await collect(reply, request)
                if key and mine:
                    await idem.finish(who.tenant, key, mine, result)
                metrics.completion_tokens(who.tenant, result.usage.completion_tokens)
                return JSONResponse(completion(rid, body.model, result).model_dump())
            first = await reply.next(settings.first_frame_grace)
            if first is not None and first.type != "delta":
                raise failure(first)
        except BaseException:
            with anyio.CancelScope(shield=True):
                if not reply.finished:
                    await cancel(reply, "client")
                if key:
                    await idem.release(who.tenant, key)
                await reply.close()
            raise
        events = stream(reply, request, body, first, key, who, mine)
        return StreamingResponse(events, media_type="text/event-stream", headers=sse.HEADERS)

    @app.post(
        "/v1/agent/step",
        response_model=AgentStepResponse,
        responses=ERRORS,
        tags=["agent"],
        openapi_extra=openapi_request_body(),
    )
    async def agent_step(
        request: Request,
        who: Who,
        idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
    ) -> Response:
        """One agent step: 1-2 frames (JSON base64 or multipart files) -> the next action.

        Errors: 409 `stale` (frame older than `stale_after`), 413 `oversized` (body,
        frame bytes, pixels, decompression bomb), 422 typed (`invalid_request`,
        `truncated`, ...) for a frame that is not a usable image, 429 `over_quota`
        with Retry-After, 503 `no_capacity`, 504 `expired` (deadline).
        """
        started = time.perf_counter()
        if not who.may_use_pool(settings.agent_pool):
            raise ApiError(403, "this key may not use the agent pool", "permission_error")
        rid = request_id(request) or ""
        raw = await request.body()
        ctype = request.headers.get("content-type", "")
        if ctype.lower().startswith("multipart/form-data"):
            step_in = parse_multipart(ctype, raw)
        elif ctype.lower().startswith("application/json") or not ctype:
            step_in = parse_json(raw)
        else:
            raise ApiError(415, f"unsupported content type {ctype[:100]!r}", code="invalid_request")
        check_frames(step_in.frames, settings.max_frame_bytes)
        f = step_in.fields
        step = AgentStep(
            id=rid, tenant=who.tenant, session=f.session, frame_ts=f.frame_ts, step=f.step,
            stale_after=f.stale_after, goal=f.goal, history=f.history, options=f.options,
            frames=[RawFrame(data=data, mime=mime[:100] or "application/octet-stream")
                    for data, mime in step_in.frames],
            deadline=time.time() + settings.agent_timeout, trace=trace(request),
        )  # fmt: skip

        idem: Idempotency = state["idem"]
        mine: Claim | None = None
        if idempotency_key:
            mine = Claim(request_id=rid, fingerprint=step_fingerprint(step_in))
            claim, ours = await idem.claim(who.tenant, idempotency_key, mine)
            if not ours:
                return await replay_step(idem, who, idempotency_key, claim, mine, step_in, started)

        reply = Reply(state["bus"], idle_timeout=settings.idle_timeout)
        await reply.start(subjects.agent_in(who.tenant), step)
        try:
            try:
                result = await collect(reply, request)
            except ApiError as exc:
                if exc.code in AGENT_STATUS:  # re-map the shared table's statuses for steps
                    exc.status = AGENT_STATUS[exc.code]
                raise
            out = response_of(result, f, time.perf_counter() - started, time.time())
            if idempotency_key and mine:
                await idem.finish(who.tenant, idempotency_key, mine, result)
        except BaseException:
            with anyio.CancelScope(shield=True):
                if not reply.finished:
                    await cancel(reply, "client")
                if idempotency_key:
                    await idem.release(who.tenant, idempotency_key)
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await reply.close()
        metrics.completion_tokens(who.tenant, result.usage.completion_tokens)
        return JSONResponse(out.model_dump(mode="json"))

    @app.post(
        "/v1/sql/ask",
        response_model=SqlAnswerBody,
        responses={
            **ERRORS,
            200: {"content": {"text/event-stream": {}}, "description": "Answer or SSE"},
        },
        tags=["sql"],
    )
    async def sql_ask(body: SqlAskBody, request: Request, who: Who) -> Response:
        """A question -> its SQL, rows, summary and chart (or a clarifying question).

        `stream: true`: SSE `{"type": "stage"}` events, then `{"type": "answer"}`, then
        `[DONE]`. Errors: 403 (`unknown_tenant`: no SQL policy), 400 (`rejected_sql`),
        429 `over_quota`, 503 `no_capacity`, 504 (`expired`, or `timeout`: silence).
        """
        if not who.may_use_pool(settings.sql_pool):
            raise ApiError(403, "this key may not use the sql pool", "permission_error")
        # The orchestrator answers `expired` to a question it reads after its deadline:
        # after `sql_timeout` of silence the edge has stopped listening, so starting
        # the question then would be work for nobody.
        ask = body.ask(
            who.tenant, request_id(request) or "", time.time() + settings.sql_timeout,
            trace(request),
        )  # fmt: skip
        reply = SqlReply(state["bus"], ask, idle_timeout=settings.sql_timeout)
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
        body_ = events(reply, request, first, settings.sse_heartbeat)
        return StreamingResponse(body_, media_type="text/event-stream", headers=sse.HEADERS)

    async def original_result(
        idem: Idempotency, who: Principal, key: str, claim: Claim, mine: Claim,
        workload: Workload,
    ) -> GenerateResult:  # fmt: skip
        """The result of the request a retried Idempotency-Key first started (waiting for it
        if it still runs); the key may not be reused for a different request."""
        if claim.fingerprint != mine.fingerprint:
            raise ApiError(
                422, "Idempotency-Key reused with a different request", code="idempotency"
            )
        result = claim.result or await idem.wait_result(
            who.tenant, key, workload, claim.request_id, settings.idempotency_wait
        )
        if result is None:
            raise ApiError(409, "the original request is still running", code="idempotency")
        return result

    async def replay_step(
        idem: Idempotency, who: Principal, key: str, claim: Claim, mine: Claim,
        step_in: StepInput, started: float,
    ) -> Response:  # fmt: skip
        """A retried step (same tenant, same key): the original's answer, never a new run."""
        result = await original_result(idem, who, key, claim, mine, "agent")
        if result.status != "ok":
            raise agent_failure(result, None)
        out = response_of(result, step_in.fields, time.perf_counter() - started, time.time())
        headers = {"x-request-id": claim.request_id, "Idempotent-Replayed": "true"}
        return JSONResponse(out.model_dump(mode="json"), headers=headers)

    async def cancel(reply: Reply, reason: str) -> None:
        metrics.CANCELS.labels(reason).inc()
        log.info("edge.cancel", request_id=reply.request_id, reason=reason)
        with contextlib.suppress(Exception):
            await reply.cancel(reason)

    async def collect(reply: Reply, request: Request) -> GenerateResult:
        """Wait for the final frame, cancelling the request if the client goes away."""
        while True:
            try:
                frame = await reply.next(POLL)
            except SwitchyardError as exc:
                raise ApiError.from_info(info_of(exc)) from None
            if frame is None:
                if await request.is_disconnected():
                    raise ApiError(499, "client disconnected", "cancelled_error", "cancelled")
                continue
            if frame.type != "delta":
                assert frame.result is not None or frame.error is not None
                if frame.type == "end" and frame.result and frame.result.status == "ok":
                    return frame.result
                raise failure(frame)

    async def stream(
        reply: Reply,
        request: Request,
        body: ChatCompletionRequest,
        first: TokenFrame | None,
        key: str | None,
        who: Principal,
        claim: Claim | None,
    ) -> AsyncIterator[str]:
        cid, created = completion_id(reply.request_id), int(time.time())

        def chunk(delta: Delta, reason: Any = None, usage: Any = None) -> str:
            choices = [] if usage is not None else [ChunkChoice(delta=delta, finish_reason=reason)]
            return sse.event(
                ChatCompletionChunk(
                    id=cid, created=created, model=body.model, choices=choices, usage=usage
                )
            )

        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        try:
            yield chunk(Delta(role="assistant", content=""))
            frame, silent_since = first, time.monotonic()
            while True:
                if frame is None:
                    if await request.is_disconnected():
                        return  # the finally clause cancels
                    if time.monotonic() - silent_since >= settings.sse_heartbeat:
                        silent_since = time.monotonic()
                        yield sse.HEARTBEAT
                elif frame.type == "delta":
                    silent_since = time.monotonic()
                    if frame.text:
                        yield chunk(Delta(content=frame.text))
                elif frame.type == "end" and frame.result and frame.result.status == "ok":
                    result = frame.result
                    if key and claim:
                        await state["idem"].finish(who.tenant, key, claim, result)
                    metrics.completion_tokens(who.tenant, result.usage.completion_tokens)
                    yield chunk(Delta(), finish_reason(result))
                    if include_usage:
                        yield chunk(Delta(), usage=usage_of(result))
                    break
                else:
                    err = failure(frame)
                    yield sse.event(err.body(reply.request_id))
                    break
                try:
                    frame = await reply.next(POLL)
                except SwitchyardError as exc:
                    yield sse.event(ApiError.from_info(info_of(exc)).body(reply.request_id))
                    break
            yield sse.DONE
        finally:
            with anyio.CancelScope(shield=True):
                if not reply.finished:
                    await cancel(reply, "client")
                    if key:
                        await state["idem"].release(who.tenant, key)
                await reply.close()

    async def replay(
        idem: Idempotency,
        who: Principal,
        key: str,
        claim: Claim,
        mine: Claim,
        body: ChatCompletionRequest,
    ) -> Response:
        """A retry with a known Idempotency-Key: the original's result, never a new run."""
        result = await original_result(idem, who, key, claim, mine, "llm")
        if result.status != "ok":
            raise ApiError.from_result(result)
        headers = {"x-request-id": claim.request_id, "Idempotent-Replayed": "true"}
        if not body.stream:
            return JSONResponse(
                completion(claim.request_id, body.model, result).model_dump(), headers=headers
            )
        cid, created = completion_id(claim.request_id), int(time.time())
        parts = [
            ChatCompletionChunk(id=cid, created=created, model=body.model, choices=[
                ChunkChoice(delta=Delta(role="assistant", content=result.text))]),
            ChatCompletionChunk(id=cid, created=created, model=body.model, choices=[
                ChunkChoice(delta=Delta(), finish_reason=finish_reason(result))]),
        ]  # fmt: skip
        if body.stream_options and body.stream_options.include_usage:
            parts.append(
                ChatCompletionChunk(
                    id=cid, created=created, model=body.model, choices=[], usage=usage_of(result)
                )
            )
        text = "".join(sse.event(p) for p in parts) + sse.DONE
        return Response(text, media_type="text/event-stream", headers={**sse.HEADERS, **headers})

    return app


def step_fingerprint(step_in: StepInput) -> str:
    """The same step in either encoding has the same fingerprint."""
    digest = hashlib.sha256(step_in.fields.model_dump_json().encode())
    for data, _ in step_in.frames:
        digest.update(hashlib.sha256(data).digest())
    return digest.hexdigest()[:64]


def failure(frame: TokenFrame) -> ApiError:
    if frame.error is not None:
        return ApiError.from_info(frame.error)
    if frame.result is not None:
        return ApiError.from_result(frame.result)
    return ApiError(500, "reply stream ended without a result", "server_error", "internal")


def info_of(exc: SwitchyardError) -> ErrorInfo:
    return ErrorInfo(code=exc.code, reason=exc.reason[:1000])


async def readiness(bus: Bus, pool: str) -> dict[str, Any]:
    checks: dict[str, Any] = {"nats": bus.nc.is_connected, "streams": False, "workers": 0}
    if not bus.nc.is_connected:
        return checks
    try:
        for name in STREAMS:
            await bus.js.stream_info(name)
        checks["streams"] = True
        kv = await bus.js.key_value("fleet_workers")
        with contextlib.suppress(Exception):  # NoKeysError: no worker yet
            for worker in await kv.keys():
                with contextlib.suppress(Exception):
                    entry = await kv.get(worker)
                    if entry.value:
                        beat = decode(entry.value, WorkerHeartbeat)
                        if beat.pool == pool and not beat.draining:
                            checks["workers"] += 1
    except Exception as exc:  # a missing stream or bucket: not ready, and say why
        checks["error"] = str(exc)[:200]
    return checks
