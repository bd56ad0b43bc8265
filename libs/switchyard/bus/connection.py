"""Connecting to NATS with reconnects, and draining on the way out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext

from switchyard.config import Settings
from switchyard.logging import get_logger

log = get_logger(__name__)

PING_INTERVAL = 5.0


@dataclass
class Bus:
    """A connection and its JetStream context, shared by everything in one process;
    `async with await connect(...) as bus:` closes it on the way out."""

    nc: Client
    js: JetStreamContext
    settings: Settings

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Drain: finish subscriptions' pending messages, flush publishes, then close."""
        if self.nc.is_closed:
            return
        try:
            await self.nc.drain()
        except Exception as exc:  # already closing or disconnected: nothing left to drain
            log.warning("nats.drain_failed", error=str(exc))
            await self.nc.close()


async def connect(settings: Settings, name: str, **overrides: Any) -> Bus:
    async def on_error(exc: Exception) -> None:
        log.warning("nats.error", error=str(exc))

    async def on_disconnected() -> None:
        if not (nc.is_closed or nc.is_draining):  # our own close is not news
            log.warning("nats.disconnected")

    async def on_reconnected() -> None:
        log.info("nats.reconnected", url=str(nc.connected_url.netloc if nc.connected_url else ""))

    options: dict[str, Any] = {
        "name": name,
        "reconnect_time_wait": 0.5,
        "max_reconnect_attempts": -1,
        "connect_timeout": 5,
        # A server cut off by the network (not killed: no reset reaches us) is noticed when
        # pings go unanswered: 3 of them 5 s apart, then the client moves to another
        # cluster member (nats-py's default waits 2 x 120 s).
        "ping_interval": PING_INTERVAL,
        "max_outstanding_pings": 3,
        # Drain waits for in-flight callbacks; a pull fetch cancelled mid-way never
        # completes, so do not let shutdown hang on it for nats-py's default 30 s.
        "drain_timeout": 5,
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
        **settings.nats_options(),
        **overrides,
    }
    nc = await nats.connect(**options)
    return Bus(nc=nc, js=nc.jetstream(timeout=10), settings=settings)
