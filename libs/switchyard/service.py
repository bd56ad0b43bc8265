"""The common life cycle of a service process: settings, logs, metrics, signals, drain.

`run_service(name, settings, main)` calls `main(bus, stop)`; `stop` is set on
SIGTERM, SIGINT or SIGHUP (a second one exits at once), and `main` is expected to stop
taking work, finish what it holds, and return. The bus is drained and closed afterwards.
A drain needs its bus: once stopping, a `main` whose bus has been gone `STRANDED_AFTER`
seconds is cancelled (nothing it holds can be answered or acked; the stream hands
every unacked message to another consumer), so a service whose NATS is gone exits
within seconds of SIGTERM instead of waiting out every publish's patience.

Its probes (`switchyard.probes`, on the metrics port) say what this module knows:
started once connected; ready while connected and not stopping. A service that knows
more (the worker: its engine) passes `probes` with its own checks added.

A `main` that cannot go on (the worker whose engine died) cleans up the same way and
raises `ServiceExit`: the process then exits with its code at once, and its supervisor
(compose's `restart:`, k8s) starts a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from switchyard import children, eventloop, otel
from switchyard.bus.connection import Bus, connect
from switchyard.config import Settings
from switchyard.logging import configure, get_logger
from switchyard.metrics import serve_metrics
from switchyard.probes import Probes

Main = Callable[[Bus, asyncio.Event], Awaitable[None]]


class ServiceExit(Exception):
    """Raised by a service's `main`, once it has cleaned up, to end the process with
    `code` (non-zero): what it serves cannot go on in this process."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"exit {code}: {reason}")
        self.code = code
        self.reason = reason


# Stopping, with the bus disconnected this long: the drain is given up (module docstring).
STRANDED_AFTER = 3.0
STRANDED_CHECK = 0.25


async def serve(name: str, settings: Settings, main: Main, probes: Probes | None = None) -> None:
    log = get_logger(name)
    stop = asyncio.Event()
    probes = probes if probes is not None else Probes()
    connected: list[Bus] = []
    probes.add("startupz", "bus", lambda: None if connected else "not connected to NATS yet")
    probes.add("readyz", "bus", lambda: _bus_down(connected))
    probes.add("readyz", "stopping", lambda: "stopping: draining" if stop.is_set() else None)
    with children.stopping_on(asyncio.get_running_loop(), stop.set):
        server = serve_metrics(settings.metrics_port, probes=probes)
        try:
            bus = await connect(settings, name)
            connected.append(bus)
            log.info("service.started", nats=settings.nats_url, metrics_port=settings.metrics_port)
            work: asyncio.Future[None] = asyncio.ensure_future(main(bus, stop))
            try:
                await _until_done_or_stranded(work, stop, bus, log)
            finally:
                if not work.done():  # cancelled ourselves (the loop is closing): so is main
                    await _cancel(work, within=STRANDED_AFTER)
                await bus.close()  # no drain without a server: then it just closes
                log.info("service.stopped")
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()


def _bus_down(connected: list[Bus]) -> str | None:
    if not connected:
        return "not connected to NATS yet"
    return None if connected[0].nc.is_connected else "NATS disconnected (reconnecting)"


async def _until_done_or_stranded(
    work: asyncio.Future[None], stop: asyncio.Event, bus: Bus, log: Any
) -> None:
    """`work`'s outcome; once `stop` is set, it is cancelled if the bus stays disconnected
    for `STRANDED_AFTER` seconds while it drains."""
    stopping: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    away = 0.0
    while not work.done():
        await asyncio.wait({work}, timeout=STRANDED_CHECK)
        away = 0.0 if bus.nc.is_connected else away + STRANDED_CHECK
        if away >= STRANDED_AFTER and not work.done():
            log.warning("service.drain_abandoned", reason="the bus is gone", after_s=away)
            # What main still sends fails at once from here (ConnectionClosedError), not
            # after each call's timeout: its clean-up code runs to its end.
            with contextlib.suppress(Exception):
                await bus.nc.close()
            await _cancel(work, within=STRANDED_AFTER)
            return
    work.result()  # its exception (ServiceExit, a crash) is the service's


async def _cancel(work: asyncio.Future[None], *, within: float) -> None:
    """Cancel `work` until it is done, for up to `within` seconds: each cancel interrupts
    the one await it stands in, and a clean-up (a `finally`) may await again."""
    deadline = asyncio.get_running_loop().time() + within
    while not work.done() and asyncio.get_running_loop().time() < deadline:
        work.cancel()
        await asyncio.wait({work}, timeout=STRANDED_CHECK)
    if work.done() and not work.cancelled():
        work.exception()  # retrieved: a clean-up's error is not logged as never retrieved


def run_service(name: str, settings: Settings, main: Main, probes: Probes | None = None) -> None:
    configure(settings.log_level, service=name)
    try:
        eventloop.run(serve(name, settings, main, probes))
    except ServiceExit as e:
        get_logger(name).error("service.exit", code=e.code, reason=e.reason)
        otel.shutdown()  # the spans still queued go to the collector (as below)
        # All it held is closed (bus, engine): skip the interpreter's finalization, which
        # in a process holding torch and vLLM is seconds of garbage collection (10 s and
        # more on a busy host) before its supervisor may start the next one.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(e.code)
    finally:
        otel.shutdown()  # the spans still queued go to the collector
