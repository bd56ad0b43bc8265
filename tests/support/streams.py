"""Per-test streams and consumers, so tests never see each other's messages."""

from __future__ import annotations

from nats.js import JetStreamContext

from switchyard.bus.provision import ensure_consumer, ensure_stream
from switchyard.bus.topology import ConsumerSpec, StreamSpec


async def scratch_stream(
    js: JetStreamContext,
    name: str,
    *,
    ack_wait: float = 30.0,
    max_deliver: int = 4,
    duplicate_window: float = 120.0,
) -> tuple[str, str, str]:
    """A work-queue stream `T<name>` on `t.<name>.>` with one durable.

    Returns (stream, subject, durable)."""
    stream, subject, durable = f"T{name}", f"t.{name}.x", f"d{name}"
    await ensure_stream(
        js,
        StreamSpec(
            stream, (f"t.{name}.>",), "workqueue", 0, "file", duplicate_window=duplicate_window
        ),
    )
    await ensure_consumer(
        js, ConsumerSpec(stream, durable, f"t.{name}.>", ack_wait, max_deliver, 16)
    )
    return stream, subject, durable
