"""Publishing envelopes to JetStream with dedupe ids and trace context."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import PubAck
from pydantic import BaseModel

from switchyard.codec import encode
from switchyard.envelope import Envelope
from switchyard.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")

MSG_ID = "Nats-Msg-Id"
TRACEPARENT = "traceparent"

# What the bus answers while a stream has no leader (a JetStream cluster electing one
# after a node died) or the connection is between servers: worth trying again, briefly.
UNAVAILABLE: tuple[type[Exception], ...] = (
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.TimeoutError,
)
# How long a service keeps trying to store what it must not lose (a result, a prepared
# request, an audit event) while the bus is unavailable: longer than a JetStream cluster
# takes to elect a new stream leader after losing a node (2-10 s measured here), shorter
# than anyone waiting for the answer would. The message id makes every retry safe.
FAILOVER_PATIENCE = 30.0
# One attempt's wait for the stream's ack while being patient: a publish to a leader that
# just died is never answered, so waiting the context's whole timeout (10 s) for it
# would be the longest part of a failover. Acks take milliseconds; a slow one is retried,
# and the message id makes the retry land once.
PATIENT_ATTEMPT = 2.0


def trace_headers(message: BaseModel, msg_id: str | None = None) -> dict[str, str]:
    headers: dict[str, str] = {}
    if isinstance(message, Envelope):
        headers[MSG_ID] = msg_id or message.id
        if message.trace:
            headers[TRACEPARENT] = message.trace
    elif msg_id:
        headers[MSG_ID] = msg_id
    return headers


async def publish(
    js: JetStreamContext,
    subject: str,
    message: BaseModel,
    *,
    msg_id: str | None = None,
    timeout: float | None = None,
    patience: float = 0.0,
) -> PubAck:
    """Publish and wait for the stream's ack. `Nats-Msg-Id` defaults to the envelope id,
    so a retried publish inside the stream's duplicate window is stored once.

    `patience`: for how many seconds an unavailable bus (`UNAVAILABLE`) is tried again
    (backing off from 0.1 to 2 s) before its error is raised; 0 raises it at once."""
    data, headers = encode(message), trace_headers(message, msg_id)
    if patience and timeout is None:
        timeout = PATIENT_ATTEMPT

    async def attempt() -> PubAck:
        return await js.publish(subject, data, headers=dict(headers), timeout=timeout)

    return await patiently(attempt, patience, what=subject)


async def patiently(attempt: Callable[[], Awaitable[T]], patience: float, *, what: str) -> T:
    """`attempt()`, tried again while the bus is unavailable (`UNAVAILABLE`: a cluster
    electing a stream's leader) for up to `patience` seconds, backing off from 0.1 to 2 s;
    then its error is raised (at once when `patience` is 0)."""
    deadline = time.monotonic() + patience
    delay = 0.1
    while True:
        try:
            return await attempt()
        except UNAVAILABLE as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.info("bus.publish_retry", subject=what, error=repr(exc), delay=delay)
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)
