"""The common life cycle of a service process: settings, logs, metrics, signals, drain.

`run_service(name, settings, main)` calls `main(bus, stop)`; `stop` is set on
SIGTERM or SIGINT, and `main` is expected to stop taking work, finish what it
holds, and return. The bus is drained and closed afterwards.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

from switchyard.bus.connection import Bus, connect
from switchyard.config import Settings
from switchyard.logging import configure, get_logger
from switchyard.metrics import serve_metrics

Main = Callable[[Bus, asyncio.Event], Awaitable[None]]


async def serve(name: str, settings: Settings, main: Main) -> None:
    log = get_logger(name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    serve_metrics(settings.metrics_port)
    bus = await connect(settings, name)
    log.info("service.started", nats=settings.nats_url, metrics_port=settings.metrics_port)
    try:
        await main(bus, stop)
    finally:
        await bus.close()
        log.info("service.stopped")


def run_service(name: str, settings: Settings, main: Main) -> None:
    configure(settings.log_level, service=name)
    asyncio.run(serve(name, settings, main))
