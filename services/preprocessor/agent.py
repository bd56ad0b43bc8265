"""Agent steps from `agent.in.<tenant>` become generate requests on `req.agent.<tenant>`.

A step is decoded, its frames prepared (`frames.py`), its prompt laid out in
its tenant's layout (`layout.py`; a window's earlier frames from `window.py`),
and published with the same id, so dedupe, cancel and the
result follow the step. Every step is answered: a frame that is hostile or
corrupt gets a typed `rejected` answer on the step's reply inbox and on `RES`,
a step whose frame is already older than its budget gets `stale` (its age on
the fleet's clock: the session's client clock offset is estimated from its
steps, `clock.py`, and travels on the request as `clock_offset`), and a
message that is not a step at all is dead-lettered and, when its reply inbox
can still be read, told why.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

import msgpack
from nats.aio.msg import Msg

from services.preprocessor import metrics
from services.preprocessor.clock import ClockOffsets
from services.preprocessor.frames import FramePreparer
from services.preprocessor.images import FrameLimits, FrameRejected, PreparedFrame
from services.preprocessor.layout import (
    LayoutChoice,
    estimate_prompt_tokens,
    estimate_window_tokens,
)
from services.preprocessor.settings import PreprocessorSettings
from services.preprocessor.window import Window, WindowStore, assemble, remember
from switchyard import otel, subjects
from switchyard.agentactions import answer_token_budget
from switchyard.agentprompt import AgentLayout, build_messages
from switchyard.answers import answer, refusal_for
from switchyard.bus.connection import Bus
from switchyard.bus.consumer import PullLoop, RetryPolicy
from switchyard.bus.publish import FAILOVER_PATIENCE, publish
from switchyard.codec import decode
from switchyard.envelope import Envelope
from switchyard.errors import DecodeError, ErrorCode, SwitchyardError
from switchyard.logging import bind_request, get_logger
from switchyard.messages.agent import AgentStep, StepOptions
from switchyard.messages.inference import (
    ActionsConstraint,
    ErrorInfo,
    GenerateRequest,
    Image,
    ResultStatus,
    Sampling,
)
from switchyard.requestpolicy import stale_frame

log = get_logger(__name__)

AGENT_DURABLE = "preprocessor-agent"


def limits_from(settings: PreprocessorSettings) -> FrameLimits:
    return FrameLimits(
        max_bytes=settings.max_frame_bytes,
        max_decode_pixels=settings.max_decode_pixels,
        max_pixels=settings.max_pixels,
        output=settings.frame_format,
        vlm=settings.agent_vlm,
    )


def to_image(frame: PreparedFrame) -> Image:
    g = frame.geometry
    return Image(
        hash=frame.hash, data=frame.data, mime=frame.mime,  # type: ignore[arg-type]
        width=g.width, height=g.height,
    )  # fmt: skip


def answer_limits(
    opts: StepOptions, settings: PreprocessorSettings
) -> tuple[Sampling, ActionsConstraint]:
    """What the model may write for a step (its format, chunk and thought) and `max_tokens`
    derived from it: the longest valid answer's tokens and a margin
    (`agentactions.answer_token_budget`), so an answer is never cut. A client asking for
    less gets that need; one asking for more gets it up to `agent_max_tokens`."""
    thought = opts.thought and settings.allow_thought
    need = answer_token_budget(opts.action_format, opts.chunk, thought)
    asked = need if opts.max_tokens is None else min(opts.max_tokens, settings.agent_max_tokens)
    constraint = ActionsConstraint(action_format=opts.action_format, chunk=opts.chunk,
                                   thought=thought)  # fmt: skip
    return Sampling(max_tokens=max(need, asked)), constraint


def to_generate(
    step: AgentStep,
    frames: list[PreparedFrame],
    settings: PreprocessorSettings,
    layout: AgentLayout | None = None,
) -> GenerateRequest:
    """The request for `step`; `frames` are the ones `layout` lays out (default: the tenant's).

    The images are exactly the prompt's frames, so the prompt-token estimate
    and the bytes on the bus follow the layout.
    """
    images = [to_image(f) for f in frames]
    vlm = settings.agent_vlm
    choice = settings.layout_for(step.tenant)
    choice = LayoutChoice(layout or choice.layout, choice.window)
    messages = build_messages(step, images, choice.layout, vlm)
    opts = step.options
    sampling, constraint = answer_limits(opts, settings)
    prompt_tokens = estimate_prompt_tokens(messages, images, vlm)
    # The model answers about the current frame, in the convention the prompt asked for:
    # the request records that profile with the frame's sizes, so the worker maps with it.
    g = dataclasses.replace(frames[-1].geometry, vlm=vlm)
    return GenerateRequest(
        id=step.id, tenant=step.tenant, created_at=step.created_at, deadline=step.deadline,
        priority=step.priority, session=step.session, frame_ts=step.frame_ts,
        reply=step.reply, trace=step.trace, workload="agent", pool=settings.agent_pool,
        messages=messages, images=images, prepared_at=time.time(),
        sampling=sampling, constraint=constraint,
        prompt_tokens=prompt_tokens,
        kv_window_tokens=estimate_window_tokens(prompt_tokens, images, choice,
                                                sampling.max_tokens, vlm),
        stale_after=step.stale_after, step=step.step,
        frame_geometry=g.frame_geometry(),
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


def _stored_at(msg: Msg) -> float:
    """When INGRESS stored `msg` (the fleet's clock); now if it carries no such time."""
    try:
        return msg.metadata.timestamp.timestamp()
    except Exception:  # not a JetStream delivery: nothing better than now
        return time.time()


def _envelope_of_undecodable(data: bytes) -> Envelope | None:
    """Enough of a broken step to answer it (id, tenant, reply), if those parts are sound."""
    with contextlib.suppress(Exception):
        raw = msgpack.unpackb(data, raw=False)
        fields = {k: raw[k] for k in ("id", "tenant", "reply") if isinstance(raw.get(k), str)}
        if len(fields) == 3:
            return Envelope(kind="agent.step", **fields)  # validates the three
    return None


async def run_agent(bus: Bus, stop: asyncio.Event, settings: PreprocessorSettings) -> None:
    # The most one request may weigh: our own limit, and the server's if it is lower.
    budget = min(settings.max_message_bytes, bus.nc.max_payload)
    problem = settings.window_problem(budget)
    if problem is not None:
        raise SwitchyardError(problem, code="oversized")
    windows = WindowStore(bus.js, settings.agent_pool, settings.agent_window_cache_mb << 20)
    uses_window = settings.agent_layout == "window" or any(
        t.layout == "window" for t in settings.agent_tenant_layouts.values()
    )
    if uses_window:
        await windows.open()
    preparer = FramePreparer(limits_from(settings), settings.frame_procs, settings.frame_cache)
    await preparer.warm_up()
    offsets = ClockOffsets()
    tracer = otel.tracer("preprocessor")

    async def on_step(msg: Msg) -> None:
        step = decode(msg.data, AgentStep, max_bytes=settings.max_message_bytes)
        with (
            bind_request(step.id, step.tenant, step.trace),
            tracer.hop("preprocessor", step.trace) as hop,
        ):
            # Staleness on the fleet's clock: the frame's capture time moved by the
            # session's estimated client clock offset (clock.py), here and downstream.
            sent = step.sent_at if step.sent_at is not None else step.created_at
            offset = offsets.observe(step.tenant, step.session, sent, _stored_at(msg))
            metrics.CLOCK_OFFSET.observe(abs(offset))
            age = time.time() - (step.frame_ts + offset)
            stale = stale_frame(age, step.stale_after, where="at preprocessing")
            if stale is not None:
                metrics.STALE.inc()
                hop.fail(stale.code, stale.reason)
                await _refuse(bus, step, settings.agent_pool, stale.status, stale.code,
                              stale.reason)  # fmt: skip
                return
            choice = settings.layout_for(step.tenant)
            # `single` and `window` lay out the current frame only (a window's earlier
            # frames come from its store): the previous one is never decoded.
            raw = step.frames if choice.layout == "pair" else step.frames[-1:]
            prepared = await preparer.prepare_all([f.data for f in raw])
            if isinstance(prepared, FrameRejected):
                log.info("agent.frame_rejected", code=prepared.code, reason=prepared.reason)
                pool = settings.agent_pool
                hop.fail(prepared.code, prepared.reason)
                await _refuse(bus, step, pool, "rejected", prepared.code, prepared.reason)
                return
            win: Window | None = None
            if choice.layout == "window":
                win = await assemble(windows, step, prepared[-1], choice.window, budget)
                prepared = win.frames
            req = to_generate(step, prepared, settings, choice.layout).model_copy(
                # The offset is clamped by `observe` to the field's range.
                update={"clock_offset": offset, "trace": hop.traceparent}
            )
            if win is not None:
                # Stored before the request leaves: the session's next step comes after
                # this one's answer, so it always finds this frame (a ms of KV put).
                await remember(windows, step, win)
            await publish(bus.js, subjects.req("agent", req.tenant), req, msg_id=req.id,
                          patience=FAILOVER_PATIENCE)  # fmt: skip

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
        max_inflight=settings.concurrency,
    )  # fmt: skip
    task = asyncio.create_task(loop.run())
    try:
        await stop.wait()
        loop.stop()
        await task
    finally:
        preparer.close()
