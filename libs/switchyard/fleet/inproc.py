"""Services as tasks on the running event loop, for tests and `sy bench edge`.

Each service runs the coroutine its `python -m services.<kind>` runs (`run_<kind>(bus,
stop, settings)` from `services.<kind>.service`, with `<Kind>Settings` from
`services.<kind>.settings`, the convention every service's `__main__` follows) on a NATS
connection of its own, so a test exercises the real service code without paying a
process start per service. The edge runs its ASGI app under uvicorn on its port.

A `Service` is described by its `SY_*` environment; here its settings are built from
that same environment, laid over `os.environ` only while the settings are made and the
service takes its first step (the worker builds its engine from `SY_SIM_*` or
`SY_LLAMACPP_*` then), and restored right after. Services start one at a time, so the
only other code that could see those variables meanwhile is the fleet's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from switchyard.bus.connection import Bus, connect
from switchyard.config import Settings
from switchyard.fleet.errors import FleetError, ServiceExited
from switchyard.fleet.processes import Stopped
from switchyard.fleet.spec import Service

Main = Callable[[Bus, asyncio.Event], Coroutine[Any, Any, None]]

STOP_TIMEOUT = 60.0  # s a service gets to drain once its stop event is set


@contextlib.contextmanager
def environ(overrides: Mapping[str, str]) -> Iterator[None]:
    """`overrides` in `os.environ` for the block; every variable restored after it."""
    before = {key: os.environ.get(key) for key in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def settings_of(service: Service, nats_url: str) -> Settings:
    """The settings `python -m <module>` would build from the service's environment."""
    kind = service.kind
    module = importlib.import_module(f"services.{kind}.settings")
    cls = cast(type[Settings], getattr(module, f"{kind.capitalize()}Settings"))
    with environ({**service.env, "SY_NATS_URL": nats_url}):
        return cls()


def main_of(kind: str, settings: Settings) -> Main:
    """`run_<kind>(bus, stop, settings)`, the coroutine the service's process runs."""
    run = getattr(importlib.import_module(f"services.{kind}.service"), f"run_{kind}")
    return lambda bus, stop: cast(Coroutine[Any, Any, None], run(bus, stop, settings))


@dataclass
class _Running:
    name: str
    task: asyncio.Task[Any]
    stop: Callable[[], None]
    bus: Bus | None = None

    def check(self) -> None:
        if not self.task.done():
            return
        exc = None if self.task.cancelled() else self.task.exception()
        why = f"failed: {type(exc).__name__}: {exc}" if exc else "returned"
        raise ServiceExited(f"{self.name} {why} while it should be running") from exc


class InprocGroup:
    """Tasks of a fleet on this loop. Leaving stops them in reverse start order: each
    gets its stop event and `STOP_TIMEOUT` seconds to drain, then its connection closes."""

    def __init__(self) -> None:
        self.running: list[_Running] = []

    async def start(self, service: Service, nats_url: str) -> None:
        """`service` from its environment, as its process would run it."""
        settings = settings_of(service, nats_url)
        if service.kind == "edge":
            await self.serve_edge(service.name, settings)
        else:
            env = {**service.env, "SY_NATS_URL": nats_url}
            await self.run(service.name, settings, main_of(service.kind, settings), env)

    async def run(
        self, name: str, settings: Settings, main: Main, env: Mapping[str, str] | None = None
    ) -> None:
        """`main(bus, stop)` as a task with its own connection; `env` as its first step runs."""
        bus = await connect(settings, name)
        stop = asyncio.Event()
        with environ(env or {}):
            task = asyncio.create_task(main(bus, stop), name=name)
            await asyncio.sleep(0)  # its first step, up to its first await, sees `env`
        self.running.append(_Running(name, task, stop.set, bus))

    async def serve_edge(self, name: str, settings: Settings) -> None:
        """The edge's app under uvicorn on `settings.port`; returns once it listens."""
        import uvicorn

        from services.edge.app import create_app
        from services.edge.server import server_config
        from services.edge.settings import EdgeSettings

        if not isinstance(settings, EdgeSettings):
            raise FleetError(f"{name}: the edge needs EdgeSettings, got {type(settings).__name__}")
        config = server_config(settings, create_app(settings), host="127.0.0.1",
                               log_level="warning")  # fmt: skip
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(), name=name)

        def stop() -> None:
            server.should_exit = True

        running = _Running(name, task, stop)
        while not server.started:  # set once the lifespan (its NATS connection) is up
            running.check()
            await asyncio.sleep(0.02)
        self.running.append(running)

    def connection(self, name: str) -> Bus:
        """The NATS connection of service `name` (to ask the fleet whether it is ready)."""
        for running in self.running:
            if running.name == name and running.bus is not None:
                return running.bus
        raise FleetError(f"no running service {name!r} with a connection of its own")

    def check(self) -> None:
        """Raise `ServiceExited` for the first task that ended."""
        for running in self.running:
            running.check()

    def exited(self) -> list[str]:
        return [r.name for r in self.running if r.task.done()]

    async def close(self) -> list[Stopped]:
        """Stop every task; then raise the first failure (a crash, or a task that did not
        stop in time and was cancelled), as awaiting the task directly would."""
        stopped: list[Stopped] = []
        failures: list[Exception] = []
        for running in reversed(self.running):
            running.stop()
            code, killed = 0, False
            try:
                await asyncio.wait_for(running.task, STOP_TIMEOUT)  # cancels it on timeout
            except TimeoutError:
                code, killed = 1, True
                failures.append(ServiceExited(f"{running.name} did not stop in {STOP_TIMEOUT} s"))
            except Exception as exc:
                code = 1
                failures.append(exc)
            finally:
                if running.bus is not None:
                    await running.bus.close()
            stopped.append(Stopped(running.name, code, killed))
        self.running.clear()
        if failures:
            raise failures[0]
        return stopped[::-1]

    async def __aenter__(self) -> InprocGroup:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@contextlib.asynccontextmanager
async def running(
    name: str, settings: Settings, main: Main, env: Mapping[str, str] | None = None
) -> AsyncIterator[InprocGroup]:
    """One service as a task for the block (see `InprocGroup.run`)."""
    async with InprocGroup() as group:
        await group.run(name, settings, main, env)
        yield group
