"""Request/reply over core NATS for the `svc.*` services, typed at both ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import BaseModel

from switchyard.bus.publish import trace_headers
from switchyard.codec import decode, encode
from switchyard.errors import StreamTimeout, SwitchyardError
from switchyard.logging import get_logger
from switchyard.messages.inference import ErrorInfo

log = get_logger(__name__)

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)

# A reply that is an error rather than the expected model carries this header.
ERROR_HEADER = "Sy-Error"


async def request(
    nc: Client, subject: str, message: BaseModel, reply_model: type[Rep], *, timeout: float
) -> Rep:
    """Send `message`, wait for a `reply_model`; typed errors for silence and refusals."""
    try:
        msg = await nc.request(
            subject, encode(message), timeout=timeout, headers=trace_headers(message)
        )
    except nats.errors.NoRespondersError as exc:
        raise SwitchyardError(f"no service answers on {subject}", code="no_capacity") from exc
    except nats.errors.TimeoutError as exc:
        raise StreamTimeout(f"{subject} did not answer within {timeout}s") from exc
    if msg.headers and msg.headers.get(ERROR_HEADER):
        info = decode(msg.data, ErrorInfo)
        raise SwitchyardError(info.reason, code=info.code)
    return decode(msg.data, reply_model)


async def serve(
    nc: Client,
    subject: str,
    request_model: type[Req],
    handler: Callable[[Req], Awaitable[BaseModel]],
    *,
    queue: str,
    concurrency: int = 1,
) -> Subscription:
    """Answer `subject` with `handler`, in a queue group so replicas share the load.

    A request that does not decode, or a handler that raises, is answered with an
    `ErrorInfo` (header `Sy-Error`), never left to time out. With `concurrency` > 1
    up to that many requests are handled at once (nats-py otherwise runs one
    subscription's callbacks one after another).
    """

    async def answer(msg: Msg) -> None:
        try:
            req = decode(msg.data, request_model)
            reply: BaseModel = await handler(req)
            headers: dict[str, str] | None = None
        except SwitchyardError as exc:
            reply, headers = ErrorInfo(code=exc.code, reason=exc.reason), {ERROR_HEADER: exc.code}
        except Exception as exc:
            log.exception("rpc.handler_failed", subject=subject)
            reply = ErrorInfo(code="internal", reason=f"{type(exc).__name__}: {exc}")
            headers = {ERROR_HEADER: "internal"}
        if msg.reply:
            with contextlib.suppress(Exception):
                await nc.publish(msg.reply, encode(reply), headers=headers)

    if concurrency <= 1:
        return await nc.subscribe(subject, queue=queue, cb=answer)
    slots = asyncio.Semaphore(concurrency)
    running: set[asyncio.Task[None]] = set()

    async def answer_in_slot(msg: Msg) -> None:
        try:
            await answer(msg)
        finally:
            slots.release()

    async def on_message(msg: Msg) -> None:
        await slots.acquire()  # beyond `concurrency`, messages wait in the subscription
        task = asyncio.create_task(answer_in_slot(msg))
        running.add(task)
        task.add_done_callback(running.discard)

    return await nc.subscribe(subject, queue=queue, cb=on_message)
