"""Agent steps from `agent.in.<tenant>` become generate requests on `req.agent.<tenant>`.

A step is decoded, its frames prepared (`frames.py`), its prompt laid out
(`layout.py`), and published with the same id, so dedupe, cancel and the
result follow the step. Every step is answered: a frame that is hostile or
corrupt gets a typed `rejected` answer on the step's reply inbox and on `RES`,
a step whose frame is already older than its budget gets `stale`, and a
message that is not a step at all is dead-lettered and, when its reply inbox
can still be read, told why.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgpack
from nats.aio.msg import Msg

from services.preprocessor.frames import FramePreparer
from services.preprocessor.images import FrameLimits, FrameRejected, PreparedFrame
from services.preprocessor.layout import estimate_prompt_tokens
from services.preprocessor.settings import PreprocessorSettings
from switchyard import subjects
from switchyard.agentprompt import build_messages
from switchyard.answers import answer, refusal_for
from switchyard.bus.connection import Bus
from switchyard.bus.consumer import PullLoop, RetryPolicy
from switchyard.bus.publish import publish
from switchyard.codec import decode
from switchyard.envelope import Envelope
from switchyard.errors import DecodeError, ErrorCode
from switchyard.logging import bind_request, get_logger
from switchyard.messages.agent import AgentStep, answer_schema
from switchyard.messages.inference import (
    ErrorInfo,
    FrameGeometry,
    GenerateRequest,
    Image,
    JsonSchemaConstraint,
    ResultStatus,
    Sampling,
)

log = get_logger(__name__)

AGENT_DURABLE = "preprocessor-agent"


def limits_from(settings: PreprocessorSettings) -> FrameLimits:
    return FrameLimits(
        max_bytes=settings.max_frame_bytes,
        max_decode_pixels=settings.max_decode_pixels,
        max_pixels=settings.max_pixels,
        output=settings.frame_format,
    )


def to_image(frame: PreparedFrame) -> Image:
    g = frame.geometry
    return Image(
        hash=frame.hash, data=frame.data, mime=frame.mime,  # type: ignore[arg-type]
        width=g.width, height=g.height,
    )  # fmt: skip


def to_generate(
    step: AgentStep, frames: list[PreparedFrame], settings: PreprocessorSettings
) -> GenerateRequest:
    images = [to_image(f) for f in frames]
    messages = build_messages(step, images)
    opts = step.options
    g = frames[-1].geometry  # the model answers in the current frame's resized pixels
    return GenerateRequest(
        id=step.id, tenant=step.tenant, created_at=step.created_at, deadline=step.deadline,
        priority=step.priority, session=step.session, frame_ts=step.frame_ts,
        reply=step.reply, trace=step.trace, workload="agent", pool=settings.agent_pool,
        messages=messages, images=images, prepared_at=time.time(),
        sampling=Sampling(max_tokens=min(opts.max_tokens, settings.agent_max_tokens)),
        constraint=JsonSchemaConstraint(
            json_schema=answer_schema(opts.chunk, opts.thought and settings.allow_thought)
        ),
        prompt_tokens=estimate_prompt_tokens(messages, images),
        stale_after=step.stale_after,
        frame_geometry=FrameGeometry(
            orig_width=g.orig_width, orig_height=g.orig_height, width=g.width, height=g.height
        ),
        # No token stream: partial JSON is no use to a phone, and its deltas would
        # carry resized-space coordinates; the worker maps the finished answer.
        stream=False,
    )  # fmt: skip


async def _refuse(
    bus: Bus, step: Envelope, pool: str, status: ResultStatus, code: ErrorCode, reason: str
) -> None:
    """Answer a step that will not become a request, on `RES` and its reply inbox."""
    error = ErrorInfo(code=code, reason=reason)
    await answer(bus.nc, bus.js, refusal_for(step, "agent", pool, status, error), step.reply)


def _envelope_of_undecodable(data: bytes) -> Envelope | None:
    """Enough of a broken step to answer it (id, tenant, reply), if those parts are sound."""
    with contextlib.suppress(Exception):
        raw = msgpack.unpackb(data, raw=False)
        fields = {k: raw[k] for k in ("id", "tenant", "reply") if isinstance(raw.get(k), str)}
        if len(fields) == 3:
            return Envelope(kind="agent.step", **fields)  # validates the three
    return None


async def run_agent(bus: Bus, stop: asyncio.Event, settings: PreprocessorSettings) -> None:
    preparer = FramePreparer(limits_from(settings), settings.frame_procs, settings.frame_cache)
    await preparer.warm_up()

    async def on_step(msg: Msg) -> None:
        step = decode(msg.data, AgentStep, max_bytes=settings.max_message_bytes)
        with bind_request(step.id, step.tenant, step.trace):
            age = time.time() - step.frame_ts
            if age > step.stale_after:
                reason = f"frame is {age:.3f}s old at preprocessing, budget {step.stale_after:.3f}s"
                await _refuse(bus, step, settings.agent_pool, "stale", "stale", reason)
                return
            prepared = await preparer.prepare_all([f.data for f in step.frames])
            if isinstance(prepared, FrameRejected):
                log.info("agent.frame_rejected", code=prepared.code, reason=prepared.reason)
                pool = settings.agent_pool
                await _refuse(bus, step, pool, "rejected", prepared.code, prepared.reason)
                return
            req = to_generate(step, prepared, settings)
            await publish(bus.js, subjects.req("agent", req.tenant), req, msg_id=req.id)

    async def on_give_up(msg: Msg, code: ErrorCode, reason: str) -> None:
        step: Envelope | None
        try:
            step = decode(msg.data, AgentStep)
        except DecodeError:
            step = _envelope_of_undecodable(msg.data)
        if step is not None:
            status: ResultStatus = "rejected" if code != "internal" else "error"
            await _refuse(bus, step, settings.agent_pool, status, code, reason)

    loop = PullLoop(
        bus.js, "INGRESS", AGENT_DURABLE, on_step, on_give_up=on_give_up,
        retry=RetryPolicy(settings.max_attempts + 1), ack_wait=settings.ingress_ack_wait,
        max_inflight=settings.concurrency, fetch_timeout=0.25,
    )  # fmt: skip
    task = asyncio.create_task(loop.run())
    try:
        await stop.wait()
        loop.stop()
        await task
    finally:
        preparer.close()
