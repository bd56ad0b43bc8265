"""The preprocessor process: turns ingress messages into schedulable requests.

`llm.in.>` (chat that clients publish on NATS; the edge prepares its own) is converted
here (`switchyard.chatprep`); `agent.in.>` (frames) is decoded, resized and laid out by
the agent path. Both consume `INGRESS` through durable
consumers, so a crash mid-message redelivers it; a message that cannot be
prepared is answered with the reason and dead-lettered, never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.msg import Msg

from services.preprocessor.settings import PreprocessorSettings
from switchyard import otel, subjects
from switchyard.answers import answer, result_for
from switchyard.bus.connection import Bus
from switchyard.bus.consumer import PullLoop, RetryPolicy
from switchyard.bus.publish import FAILOVER_PATIENCE, publish
from switchyard.chatprep import prepare_chat
from switchyard.codec import decode
from switchyard.errors import DecodeError, ErrorCode
from switchyard.logging import bind_request, get_logger
from switchyard.messages.inference import ChatRequest, ErrorInfo

log = get_logger(__name__)

CHAT_DURABLE = "preprocessor-chat"


async def run_chat(bus: Bus, stop: asyncio.Event, settings: PreprocessorSettings) -> None:
    tracer = otel.tracer("preprocessor")

    async def on_chat(msg: Msg) -> None:
        chat = decode(msg.data, ChatRequest, max_bytes=settings.max_message_bytes)
        with (
            bind_request(chat.id, chat.tenant, chat.trace),
            tracer.hop("preprocessor", chat.trace) as hop,
        ):
            req = prepare_chat(chat.model_copy(update={"trace": hop.traceparent}),
                               settings.chat_pool)  # fmt: skip
            subject = subjects.req("llm", req.tenant)
            await publish(bus.js, subject, req, msg_id=req.id, patience=FAILOVER_PATIENCE)

    async def on_give_up(msg: Msg, code: ErrorCode, reason: str) -> None:
        with contextlib.suppress(DecodeError):
            req = prepare_chat(decode(msg.data, ChatRequest), settings.chat_pool)
            error = ErrorInfo(code=code, reason=reason)
            await answer(bus.nc, bus.js, result_for(req, "error", error), req.reply)

    loop = PullLoop(
        bus.js, "INGRESS", CHAT_DURABLE, on_chat, on_give_up=on_give_up,
        retry=RetryPolicy(settings.max_attempts + 1), ack_wait=settings.ingress_ack_wait,
        max_inflight=settings.concurrency,
    )  # fmt: skip
    task = asyncio.create_task(loop.run())
    await stop.wait()
    loop.stop()
    await task


async def run_preprocessor(bus: Bus, stop: asyncio.Event, settings: PreprocessorSettings) -> None:
    # Imported here so the chat path does not load Pillow and the frame pool.
    from services.preprocessor.agent import run_agent

    async with asyncio.TaskGroup() as tg:
        tg.create_task(run_chat(bus, stop, settings))
        tg.create_task(run_agent(bus, stop, settings))
