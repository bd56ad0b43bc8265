"""The sqlflow process: questions from `sql.in.>` become answers, stage by stage.

Consumes `INGRESS` through the durable `sqlflow` consumer (a crash mid-question
redelivers it). Stage events go to the asker's reply inbox as they happen, and a
`StageProgress` every `keepalive_interval` seconds until the answer, so an asker's
idle timeout measures a gone orchestrator, not a slow model; the
answer goes to `res.sql.<tenant>` first, deduplicated by `res-<request id>`, and
then to the inbox, so a redelivered question is never answered twice. A question
that cannot be answered (undecodable, expired, failing every attempt) is
answered with the reason and dead-lettered: never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import nats.errors
from nats.aio.msg import Msg

from services.sqlflow import metrics
from services.sqlflow.settings import SqlflowSettings
from switchyard import answers, otel, subjects
from switchyard.bus.connection import Bus
from switchyard.bus.consumer import PullLoop, RetryPolicy
from switchyard.codec import decode, encode
from switchyard.errors import DecodeError, ErrorCode
from switchyard.logging import bind_request, get_logger
from switchyard.messages.inference import Cancel
from switchyard.messages.sql import SqlAnswer, SqlAsk, StageEvent, StageName
from switchyard.sqlguard.policy import PolicyStore
from switchyard.text2sql.fleet import FleetModel
from switchyard.text2sql.guard import GuardClient
from switchyard.text2sql.index import KnowledgeIndex, open_index
from switchyard.text2sql.knowledge import KnowledgeStore
from switchyard.text2sql.pipeline import Pipeline, Underway, error_answer

log = get_logger(__name__)

DURABLE = "sqlflow"


def build_pipeline(bus: Bus, settings: SqlflowSettings, index: KnowledgeIndex) -> Pipeline:
    return Pipeline(
        bus,
        KnowledgeStore(settings.knowledge_dir),
        PolicyStore(settings.sql_policy_dir),
        index,
        FleetModel(
            bus,
            pool=settings.sql_pool,
            model=settings.sql_model,
            lora=settings.sql_lora,
            idle_timeout=settings.model_idle_timeout,
            tracer=otel.tracer("sqlflow"),
        ),
        GuardClient(bus, timeout=settings.guard_timeout),
        settings.flow_options(),
    )


async def deliver(bus: Bus, answer: SqlAnswer, reply: str | None) -> bool:
    """RES first (deduplicated), then the inbox (`answers.answer`), counted once; False
    when already answered."""
    if not await answers.answer(bus.nc, bus.js, answer, reply):
        return False
    metrics.ANSWERS.labels(answer.path, answer.status).inc()
    metrics.ANSWER_SECONDS.labels(answer.path).observe(answer.duration)
    return True


async def run_sqlflow(
    bus: Bus, stop: asyncio.Event, settings: SqlflowSettings, index: KnowledgeIndex | None = None,
    built: threading.Event | None = None,
) -> None:  # fmt: skip
    """Answer questions until `stop`; set `built` (its probes' `pending` check: opening the
    index can take tens of seconds) once the pipeline is built."""
    own_index = index is None
    if index is None:
        index = await asyncio.to_thread(open_index, settings.knowledge_index, settings.qdrant_url)
    pipeline = build_pipeline(bus, settings, index)
    if built is not None:
        built.set()
    running: dict[str, asyncio.Task[SqlAnswer]] = {}
    tracer = otel.tracer("sqlflow")

    async def on_cancel(msg: Msg) -> None:
        """`cancel.<question id>` (the edge when its client goes away): stop the question;
        its model call is cancelled with it (`FleetModel`)."""
        with contextlib.suppress(DecodeError):
            request_id = decode(msg.data, Cancel).request_id
            if (task := running.get(request_id)) is not None:
                task.cancel()

    cancels = await bus.nc.subscribe(subjects.CANCEL_ALL, cb=on_cancel)

    async def on_ask(msg: Msg) -> None:
        ask = decode(msg.data, SqlAsk, max_bytes=settings.max_message_bytes)
        with (
            bind_request(ask.id, ask.tenant, ask.trace),
            tracer.hop("sqlflow", ask.trace) as hop,
        ):
            await answer_one(ask, hop)

    async def answer_one(asked: SqlAsk, hop: otel.Hop) -> None:
        # What the question sends onward (model calls, validator, executor, audit) is
        # under this hop's span.
        ask = asked.model_copy(update={"trace": hop.traceparent})
        if ask.deadline is not None and ask.deadline < time.time():
            reason = "the question's deadline passed before it was read"
            hop.fail("expired", reason)
            await deliver(bus, error_answer(ask, "expired", reason), ask.reply)
            return

        async def emit(stage: StageName, seconds: float, data: dict[str, Any]) -> None:
            metrics.STAGE_SECONDS.labels(stage).observe(seconds)
            now = time.time()
            hop.child(f"sqlflow.{stage}", now - seconds, now)
            if stage == "summary" and data.get("replaced"):
                metrics.SUMMARY_REPLACED.inc()
            if ask.reply:
                event = StageEvent(tenant=ask.tenant, trace=ask.trace, request_id=ask.id,
                                   stage=stage, seconds=seconds, data=data)  # fmt: skip
                await bus.nc.publish(ask.reply, encode(event))

        underway = Underway()
        task = asyncio.create_task(pipeline.answer(ask, emit, underway))
        running[ask.id] = task
        beats = asyncio.create_task(keep_alive(ask, ask.reply, underway)) if ask.reply else None
        try:
            answer = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this process is stopping: the question is redelivered
            # The asker cancelled it.
            answer = error_answer(ask, "cancelled", "the asker cancelled the question")
            await pipeline.audit(answer)
        finally:
            running.pop(ask.id, None)
            if beats is not None:
                # Before the answer: no keepalive may follow it; and a question
                # this process gives up (stopping) falls silent with it.
                beats.cancel()
        if answer.status == "error" and answer.error is not None:
            hop.fail(answer.error.code, answer.error.reason)
        await deliver(bus, answer, ask.reply)
        log.info("sqlflow.answered", path=answer.path, status=answer.status,
                 seconds=round(answer.duration, 3))  # fmt: skip

    async def keep_alive(ask: SqlAsk, reply: str, underway: Underway) -> None:
        """A `StageProgress` on the asker's inbox now (the question is taken: the asker's
        wait for its turn is over) and every `keepalive_interval` s after, whatever the
        stages do: a fixed beat is what lets the asker tell silence from slowness."""
        while True:
            # Best effort: a frame that cannot go out (the connection reconnecting past
            # its buffer) is as if lost; the next one may, and the question goes on.
            with contextlib.suppress(nats.errors.Error):
                await bus.nc.publish(reply, encode(underway.progress(ask)))
            await asyncio.sleep(settings.keepalive_interval)

    async def on_give_up(msg: Msg, code: ErrorCode, reason: str) -> None:
        with contextlib.suppress(DecodeError):
            ask = decode(msg.data, SqlAsk, max_bytes=settings.max_message_bytes)
            await deliver(bus, error_answer(ask, code, reason), ask.reply)

    loop = PullLoop(
        bus.js, "INGRESS", DURABLE, on_ask, on_give_up=on_give_up,
        retry=RetryPolicy(settings.max_attempts + 1), ack_wait=settings.ingress_ack_wait,
        max_inflight=settings.concurrency,
        drain_timeout=settings.drain_timeout,
    )  # fmt: skip
    task = asyncio.create_task(loop.run())
    log.info("sqlflow.ready", knowledge=str(settings.knowledge_dir), scope=settings.scope)
    try:
        await stop.wait()
        loop.stop()
        await task
        await cancels.unsubscribe()
    finally:
        if own_index:
            index.close()
