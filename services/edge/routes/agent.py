"""`POST /v1/agent/step`: one agent step, 1-2 frames -> the next action (see `edge.agent`)."""

from __future__ import annotations

import hashlib
import time
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response

from services.edge import metrics
from services.edge.agent import (
    AGENT_STATUS,
    AgentStepResponse,
    StepInput,
    check_frames,
    openapi_request_body,
    parse_json,
    parse_multipart,
    response_of,
)
from services.edge.errors import API_ERRORS, ApiError, Forbidden
from services.edge.lifecycle import Replay, refusal, request_lifecycle
from services.edge.replies import json_answer
from services.edge.state import State, Who, request_id, traceparent
from switchyard.messages.agent import AgentStep, RawFrame
from switchyard.messages.inference import GenerateResult

router = APIRouter(tags=["agent"])


@router.post(
    "/v1/agent/step",
    response_model=AgentStepResponse,
    responses=API_ERRORS,
    openapi_extra=openapi_request_body(),
)
async def agent_step(
    request: Request,
    state: State,
    who: Who,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> Response:
    """One agent step: 1-2 frames (JSON base64 or multipart files) -> the next action.

    Errors: 409 `stale` (frame older than `stale_after`, on the fleet's clock: send
    `sent_at` so a skewed client clock is corrected) or `superseded` (a newer step of the
    session arrived before this one started), 413 `oversized` (body,
    frame bytes, pixels, decompression bomb), 422 typed (`invalid_request`,
    `truncated`, ...) for a frame that is not a usable image, 429 `over_quota`
    with Retry-After, 502 `answer_cut` (the model's answer stopped at max_tokens or is
    not an action: never a partial action), 503 `no_capacity`, 504 `expired` (deadline).
    """
    started = time.perf_counter()
    settings = state.settings
    if not who.may_use_pool(settings.agent_pool):
        raise Forbidden("this key may not use the agent pool")
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
        **dict(f), id=request_id(request), tenant=who.tenant,
        frames=[RawFrame(data=data, mime=mime[:100] or "application/octet-stream")
                for data, mime in step_in.frames],
        deadline=time.time() + settings.agent_timeout, trace=traceparent(request),
    )  # fmt: skip

    async with request_lifecycle(
        state, request, "agent", GenerateResult, step, key=idempotency_key,
        fingerprint=lambda: step_fingerprint(step_in), statuses=AGENT_STATUS,
    ) as flight:  # fmt: skip
        if isinstance(flight, Replay):
            return await replay(flight, step_in, started)
        result = await flight.result()
        out = response_of(result, f, time.perf_counter() - started, time.time())
        await flight.finish(result)
    metrics.completion_tokens(who.tenant, result.usage.completion_tokens)
    return json_answer(out)


async def replay(retry: Replay[GenerateResult], step_in: StepInput, started: float) -> Response:
    """A retried step (same tenant, same key): the original's answer, never a new run."""
    result = await retry.result()
    if (error := refusal(result, AGENT_STATUS)) is not None:
        raise error
    out = response_of(result, step_in.fields, time.perf_counter() - started, time.time())
    return json_answer(out, retry.headers)


def step_fingerprint(step_in: StepInput) -> str:
    """The same step in either encoding has the same fingerprint."""
    # A retry is sent later: its send time is not part of what it asks.
    digest = hashlib.sha256(step_in.fields.model_dump_json(exclude={"sent_at"}).encode())
    for data, _ in step_in.frames:
        digest.update(hashlib.sha256(data).digest())
    return digest.hexdigest()[:64]
