"""The common life cycle of a service process: settings, logs, metrics, signals, drain.

`run_service(name, settings, main)` calls `main(bus, stop)`; `stop` is set on
SIGTERM or SIGINT, and `main` is expected to stop taking work, finish what it
holds, and return. The bus is drained and closed afterwards. A `main` that cannot go on
(the worker whose engine died) cleans up the same way and raises `ServiceExit`: the
process then exits with its code at once, and its supervisor (compose's `restart:`, k8s)
starts a fresh one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable

from switchyard import eventloop
from switchyard.bus.connection import Bus, connect
from switchyard.config import Settings
from switchyard.logging import configure, get_logger
from switchyard.metrics import serve_metrics

Main = Callable[[Bus, asyncio.Event], Awaitable[None]]


class ServiceExit(Exception):
    """Raised by a service's `main`, once it has cleaned up, to end the process with
    `code` (non-zero): what it serves cannot go on in this process."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"exit {code}: {reason}")
        self.code = code
        self.reason = reason


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
    try:
        eventloop.run(serve(name, settings, main))
    except ServiceExit as e:
        get_logger(name).error("service.exit", code=e.code, reason=e.reason)
        # All it held is closed (bus, engine): skip the interpreter's finalization, which
        # in a process holding torch and vLLM is seconds of garbage collection (10 s and
        # more on a busy host) before its supervisor may start the next one.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(e.code)
