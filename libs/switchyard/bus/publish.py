"""Publishing envelopes to JetStream with dedupe ids and trace context."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import PubAck
from pydantic import BaseModel

from switchyard.codec import encode
from switchyard.envelope import Envelope

MSG_ID = "Nats-Msg-Id"
TRACEPARENT = "traceparent"


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
) -> PubAck:
    """Publish and wait for the stream's ack. `Nats-Msg-Id` defaults to the envelope id,
    so a retried publish inside the stream's duplicate window is stored once."""
    return await js.publish(
        subject, encode(message), headers=trace_headers(message, msg_id), timeout=timeout
    )
