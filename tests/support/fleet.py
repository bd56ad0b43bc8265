"""A fleet's services one at a time, for tests that compose their own: on this loop
(`switchyard.fleet.inproc`) or as child processes, plus helpers that send them work."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext

from services.worker.service import run_worker
from services.worker.settings import WorkerSettings
from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import UNAVAILABLE, publish
from switchyard.bus.streamread import Window, read
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.bus.topology import WORKERS_BUCKET, TopologySettings
from switchyard.codec import decode
from switchyard.fleet import ProcessGroup, provision
from switchyard.fleet.errors import NotReady
from switchyard.fleet.inproc import running
from switchyard.fleet.processes import Child
from switchyard.fleet.readiness import (
    POLL,
    Check,
    PoolReady,
    fresh_heartbeats,
    wait_for_pools,
)
from switchyard.messages.fleet import WorkerHeartbeat
from switchyard.messages.inference import GenerateRequest, GenerateResult, TokenFrame
from switchyard.partition import partition


async def provision_pool(
    js: JetStreamContext,
    pool: str,
    partitions: int = 4,
    ack_wait: float = 30.0,
    req_ack_wait: float = 10.0,
) -> None:
    """The shared streams plus WORK consumers of a pool private to one test."""
    topo = TopologySettings(
        partitions=partitions, pools=[pool], work_ack_wait=ack_wait, req_ack_wait=req_ack_wait
    )
    await provision(topo, js=js)


async def wait_for_pool(
    js: JetStreamContext, pool: str, workers: int = 1, partitions: int = 4, *,
    timeout: float = 120.0, **wait: Any,
) -> None:  # fmt: skip
    """Until the router has assigned every partition of a test's private `pool` to its
    workers (`<pool>-w0`, `<pool>-w1`, ... as these tests name them) and they bound them.
    `wait`: `since`, `check` as for `wait_for_pools`."""
    ids = tuple(f"{pool}-w{i}" for i in range(workers))
    ready = PoolReady(pool, workers, partitions, worker_ids=ids)
    await wait_for_pools(js, [ready], timeout=timeout, **wait)


async def heartbeat(js: JetStreamContext, worker: str) -> WorkerHeartbeat | None:
    """`worker`'s latest heartbeat (what it runs and holds), if it has a live one."""
    kv = await js.key_value(WORKERS_BUCKET)
    beats = await fresh_heartbeats(js, kv, 0.0, (worker,), only_known=True)
    return beats.get(worker)


def work_subject(req: GenerateRequest, partitions: int = 4) -> str:
    key = req.session or req.tenant
    return subjects.work(req.pool, partition(key, partitions))


@contextlib.asynccontextmanager
async def worker_in_process(nats_url: str, **overrides: Any) -> AsyncIterator[WorkerSettings]:
    """A worker on this loop, yielded once it heartbeats (its engine is up); with static
    assignment (the default here) once it has bound its partitions too."""
    overrides = {"assignment": "static", "partitions": 4, "heartbeat_interval": 0.3, **overrides}
    settings = WorkerSettings(nats_url=nats_url, **overrides)
    since = time.time()
    name = f"test-{settings.worker_id}"
    async with running(name, settings, lambda bus, stop: run_worker(bus, stop, settings)) as group:
        js = group.connection(name).js
        if settings.assignment == "static":
            pool = PoolReady(settings.pool, 1, settings.partitions, routed=False,
                             worker_ids=(settings.worker_id,))  # fmt: skip
            await wait_for_pools(js, [pool], since=since, timeout=120, check=group.check)
        else:
            await wait_for_heartbeat(js, settings.worker_id, since=since, timeout=120,
                                     check=group.check)  # fmt: skip
        yield settings


@contextlib.contextmanager
def worker_process(nats_url: str, **env: str) -> Iterator[Child]:
    with service_process("worker", nats_url, **env) as child:
        yield child


@contextlib.contextmanager
def service_process(name: str, nats_url: str, **env: str) -> Iterator[Child]:
    """`python -m services.<name>` with `SY_*` overrides, its output kept (`Child.output()`);
    stopped (SIGTERM, then SIGKILL) on exit."""
    with (
        tempfile.TemporaryDirectory(prefix=f"test-{name}-") as logs,
        ProcessGroup(Path(logs), grace=30) as group,
    ):
        yield group.start(name, (sys.executable, "-m", f"services.{name}"),
                          {"SY_NATS_URL": nats_url, **env})  # fmt: skip


async def ask(bus: Bus, req: GenerateRequest, *, timeout: float = 60.0) -> list[TokenFrame]:
    """Publish `req` straight to its WORK partition and collect its token stream."""
    async with TokenStreamReader(bus.nc, idle_timeout=timeout) as reader:
        await publish(bus.js, work_subject(req), req.model_copy(update={"reply": reader.inbox}))
        return [frame async for frame in reader]


@contextlib.asynccontextmanager
async def router_in_process(nats_url: str, **overrides: Any) -> AsyncIterator[Any]:
    """The router's admission, scheduling and placement on this loop; yields the `Router`."""
    from services.router.router import Router
    from services.router.service import load_policies
    from services.router.settings import RouterSettings

    settings = RouterSettings(nats_url=nats_url, **overrides)
    router: list[Router] = []

    async def main(bus: Bus, stop: asyncio.Event) -> None:
        router.append(Router(bus, settings, load_policies(settings)))
        await router[0].run(stop)

    async with running("test-router", settings, main):
        yield router[0]  # made in the task's first step, which `running` lets run


async def submit(bus: Bus, req: GenerateRequest, *, timeout: float = 60.0) -> list[TokenFrame]:
    """Publish `req` on `req.<workload>.<tenant>` (through the router) and collect its stream."""
    async with TokenStreamReader(bus.nc, idle_timeout=timeout) as reader:
        sent = req.model_copy(update={"reply": reader.inbox})
        await publish(bus.js, subjects.req(req.workload, req.tenant), sent)
        return [frame async for frame in reader]


@contextlib.asynccontextmanager
async def preprocessor_in_process(nats_url: str, **overrides: Any) -> AsyncIterator[None]:
    from services.preprocessor.service import run_preprocessor
    from services.preprocessor.settings import PreprocessorSettings

    settings = PreprocessorSettings(nats_url=nats_url, **overrides)
    async with running(
        "test-preprocessor", settings, lambda bus, stop: run_preprocessor(bus, stop, settings)
    ):
        yield


async def stored_results(
    bus: Bus, workload: str, tenant: str, ids: set[str], *, timeout: float
) -> list[tuple[GenerateResult, float]]:
    """Every result of `tenant` on RES with when RES stored it, once each of `ids` has
    one (or `timeout` passed): what the fleet answered, whatever its clients saw."""
    deadline = time.monotonic() + timeout
    found: list[tuple[GenerateResult, float]] = []
    next_seq = 1  # each poll reads only what RES stored since the last one
    while True:
        try:
            window = Window(subject=subjects.res(workload, tenant), first_seq=next_seq)
            async for stored in read(bus.js, "RES", window):
                found.append((decode(stored.data, GenerateResult), stored.time))
                next_seq = stored.seq + 1
        except UNAVAILABLE:
            pass  # an election: what was read stays read; the next poll goes on from there
        if ids <= {r.request_id for r, _ in found} or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.5)


@contextlib.asynccontextmanager
async def chat_fleet_in_process(
    nats_url: str, pool: str, policy: Path, engine: str = "sim"
) -> AsyncIterator[None]:
    """What a chat needs behind an edge, on this loop: the router (over `pool`, tenant
    policies from `policy`), one worker `<pool>-w0` with `engine`, the preprocessor."""
    async with (
        router_in_process(nats_url, partitions=4, pools=[pool], tenant_policy=policy,
                          rebalance_interval=0.2),
        worker_in_process(nats_url, pool=pool, engine=engine, assignment="kv",
                          worker_id=f"{pool}-w0", heartbeat_interval=0.3),
        preprocessor_in_process(nats_url, chat_pool=pool),
    ):  # fmt: skip
        yield


async def wait_for_heartbeat(
    js: JetStreamContext, worker: str, *, timeout: float, check: Check, since: float = 0.0
) -> WorkerHeartbeat:
    """Until `worker` heartbeats (its engine started, its serving loop running); `since`
    as for `wait_for_pools` (test harness: no shipped code waits for one worker)."""
    kv = await js.key_value(WORKERS_BUCKET)
    deadline = time.monotonic() + timeout
    while True:
        check()
        beat = (await fresh_heartbeats(js, kv, since, {worker}, only_known=True)).get(worker)
        if beat is not None:
            return beat
        if time.monotonic() > deadline:
            raise NotReady(f"worker {worker} sent no heartbeat within {timeout:.0f} s")
        await asyncio.sleep(POLL)
