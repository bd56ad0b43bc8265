"""`launch(spec)`: a fleet up and ready for the block, and always taken down after it.

In order: NATS (the URL given, else a throwaway embedded server), the topology, every
service of the roster (child processes, or tasks on the caller's loop), then
`Fleet.wait_ready()`. Leaving stops the services first (processes: SIGTERM, SIGKILL
after `grace`; tasks: their stop event) and the embedded NATS last, so the services
drain instead of reconnecting to a server that went away.

Process mode works with `with` (a benchmark that then runs `asyncio.run` itself) and
with `async with`; in-process mode only with `async with`, its services being tasks on
the caller's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from switchyard.bus.connection import connect
from switchyard.bus.provision import Change
from switchyard.bus.topology import TopologySettings
from switchyard.fleet.bus import nats_server, provision
from switchyard.fleet.errors import FleetError
from switchyard.fleet.inproc import InprocGroup
from switchyard.fleet.processes import GRACE, OutputSink, ProcessGroup, Stopped
from switchyard.fleet.readiness import PoolState, wait_for_pools, wait_http
from switchyard.fleet.spec import FleetSpec, Roster

Mode = Literal["process", "inproc"]

READY_TIMEOUT = 120.0  # s: llama.cpp workers load their model first, on a shared machine


async def _quiet() -> None:
    """Closing our own short connection is not worth a warning."""


class Fleet:
    """A launched fleet: where it listens, whether its services still run, and when it
    is ready. `processes` or `tasks` holds its services, by mode."""

    def __init__(
        self, roster: Roster, client: TopologySettings, since: float, provisioned: list[Change],
        processes: ProcessGroup | None = None, tasks: InprocGroup | None = None,
    ) -> None:  # fmt: skip
        self.roster = roster
        self.client = client  # how the launcher itself connects (provisioning, readiness)
        self.since = since
        self.provisioned = provisioned
        self.processes = processes
        self.tasks = tasks

    @property
    def nats_url(self) -> str:
        return self.client.nats_url

    @property
    def edge_url(self) -> str | None:
        return self.roster.edge_url

    def check(self) -> None:
        """Raise `ServiceExited`, quoting its log, if a service is no longer running."""
        if self.processes is not None:
            self.processes.check()
        if self.tasks is not None:
            self.tasks.check()

    def exited(self) -> list[str]:
        """The services that are no longer running."""
        if self.processes is not None:
            return [child.name for child in self.processes.exited()]
        return self.tasks.exited() if self.tasks is not None else []

    async def wait_ready(self, timeout: float = READY_TIMEOUT) -> list[PoolState]:
        """Until every pool is ready and the edge answers `/readyz` (`readiness`); the
        pools' state then. Fails at once if a service exits meanwhile."""
        deadline = time.monotonic() + timeout
        states: list[PoolState] = []
        if self.roster.pools:
            async with await connect(self.client, "sy-fleet-ready", disconnected_cb=_quiet) as bus:
                states = await wait_for_pools(
                    bus.js, self.roster.pools, since=self.since, timeout=timeout, check=self.check
                )
        if self.edge_url is not None:
            left = max(1.0, deadline - time.monotonic())
            url = f"{self.edge_url}/readyz"
            await asyncio.to_thread(
                wait_http, url, timeout=left, check=self.check, cafile=self.roster.edge_ca
            )
        return states

    async def stop(self) -> list[Stopped]:
        """Stop every service now (leaving the launch does it too); how each ended."""
        if self.processes is not None:
            return await asyncio.to_thread(self.processes.close)
        return await self.tasks.close() if self.tasks is not None else []


class Launch:
    """The context manager `launch()` returns; see the module docstring."""

    def __init__(
        self, fleet: FleetSpec | Roster, mode: Mode, *, nats_url: str | None,
        nats_identity: Mapping[str, Any] | None, log_dir: Path | None,
        on_output: OutputSink | None, ready_timeout: float | None, grace: float,
    ) -> None:  # fmt: skip
        self.fleet, self.mode, self.nats_url = fleet, mode, nats_url
        self.nats_identity, self.log_dir, self.on_output = nats_identity, log_dir, on_output
        self.ready_timeout, self.grace = ready_timeout, grace
        self._sync = contextlib.ExitStack()
        self._async = contextlib.AsyncExitStack()

    def __enter__(self) -> Fleet:
        if self.mode != "process":
            raise FleetError("an in-process fleet runs on the caller's loop: use `async with`")
        try:
            roster, client, since = self._prepare(self._sync)
            provisioned = asyncio.run(provision(client))
            processes = self._processes(self._sync, roster, client.nats_url)
            self._sync.callback(processes.close)
            fleet = Fleet(roster, client, since, provisioned, processes=processes)
            if self.ready_timeout is not None:
                asyncio.run(fleet.wait_ready(self.ready_timeout))
        except BaseException:
            self._sync.close()
            raise
        return fleet

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self._sync.close()

    async def __aenter__(self) -> Fleet:
        stack = self._async
        try:
            roster, client, since = self._prepare(stack)
            provisioned = await provision(client)
            if self.mode == "process":
                processes = self._processes(stack, roster, client.nats_url)
                stack.push_async_callback(asyncio.to_thread, processes.close)
                fleet = Fleet(roster, client, since, provisioned, processes=processes)
            else:
                tasks = InprocGroup()
                stack.push_async_callback(tasks.close)
                for service in roster.services:
                    await tasks.start(service, client.nats_url)
                fleet = Fleet(roster, client, since, provisioned, tasks=tasks)
            if self.ready_timeout is not None:
                await fleet.wait_ready(self.ready_timeout)
        except BaseException:
            await stack.aclose()
            raise
        return fleet

    async def __aexit__(self, *exc: object) -> None:
        await self._async.aclose()

    def _prepare(
        self, stack: contextlib.ExitStack[Any] | contextlib.AsyncExitStack[Any]
    ) -> tuple[Roster, TopologySettings, float]:
        """NATS up, the roster expanded, and how the launcher connects."""
        since = time.time()
        url = stack.enter_context(nats_server(self.nats_url))
        workdir = self.log_dir or Path(tempfile.mkdtemp(prefix="sy-fleet-"))  # kept: logs
        workdir.mkdir(parents=True, exist_ok=True)
        roster = self.fleet.roster(workdir) if isinstance(self.fleet, FleetSpec) else self.fleet
        self.log_dir = workdir
        fields: dict[str, Any] = {"nats_url": url, "partitions": roster.partitions}
        if roster.pools:
            fields["pools"] = [pool.pool for pool in roster.pools]
        if self.nats_identity is not None:
            fields |= self.nats_identity
        return roster, TopologySettings(**fields), since

    def _processes(
        self, stack: contextlib.ExitStack[Any] | contextlib.AsyncExitStack[Any], roster: Roster,
        nats_url: str,
    ) -> ProcessGroup:  # fmt: skip
        log_dir = None if self.on_output is not None else self.log_dir
        group = ProcessGroup(log_dir, on_output=self.on_output, grace=self.grace)
        try:
            for service in roster.services:
                env = {**service.env, "SY_NATS_URL": nats_url, "PYTHONUNBUFFERED": "1"}
                group.start(service.name, service.argv, env)
        except BaseException:
            group.close()
            raise
        return group


def launch(
    fleet: FleetSpec | Roster, mode: Mode = "process", *, nats_url: str | None = None,
    nats_identity: Mapping[str, Any] | None = None, log_dir: Path | None = None,
    on_output: OutputSink | None = None, ready_timeout: float | None = READY_TIMEOUT,
    grace: float = GRACE,
) -> Launch:  # fmt: skip
    """A context manager yielding the `Fleet` once it is ready.

    `nats_url`: run on that server (else on an embedded one, stopped last);
    `nats_identity`: the Settings fields (user, nkey seed file, TLS files) the launcher
    provisions and watches readiness as; `log_dir`: where the children's logs and the
    files the spec writes (tenant policy, keys) go (a kept temporary directory
    otherwise); `on_output`: the children's output line by line instead of log files;
    `ready_timeout`: None to return at once and call `Fleet.wait_ready()` yourself;
    `grace`: seconds from SIGTERM to SIGKILL.
    """
    return Launch(
        fleet, mode, nats_url=nats_url, nats_identity=nats_identity, log_dir=log_dir,
        on_output=on_output, ready_timeout=ready_timeout, grace=grace,
    )  # fmt: skip
