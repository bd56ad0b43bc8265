"""Helpers to run workers and send them work on a real NATS, without a router."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

from nats.js import JetStreamContext

from services.worker.service import run_worker
from services.worker.settings import WorkerSettings
from switchyard import subjects
from switchyard.bus.connection import Bus, connect
from switchyard.bus.provision import provision
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.bus.topology import TopologySettings, build_topology
from switchyard.messages.inference import GenerateRequest, TokenFrame
from switchyard.partition import partition
from tests.conftest import REPO


async def provision_pool(
    js: JetStreamContext,
    pool: str,
    partitions: int = 4,
    ack_wait: float = 30.0,
    req_ack_wait: float = 30.0,
) -> None:
    """The shared streams plus WORK consumers of a pool private to one test."""
    topo = TopologySettings(
        partitions=partitions, pools=[pool], work_ack_wait=ack_wait, req_ack_wait=req_ack_wait
    )
    await provision(js, build_topology(topo))


def work_subject(req: GenerateRequest, partitions: int = 4) -> str:
    key = req.session or req.tenant
    return subjects.work(req.pool, partition(key, partitions))


@contextlib.asynccontextmanager
async def worker_in_process(nats_url: str, **overrides: Any) -> AsyncIterator[WorkerSettings]:
    overrides = {"assignment": "static", "partitions": 4, **overrides}
    settings = WorkerSettings(nats_url=nats_url, **overrides)
    bus = await connect(settings, f"test-{settings.worker_id}")
    stop = asyncio.Event()
    task = asyncio.create_task(run_worker(bus, stop, settings))
    await asyncio.sleep(0.3)  # let it bind its partitions
    if task.done():
        task.result()  # surface a start-up error
    try:
        yield settings
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        await bus.close()


@contextlib.contextmanager
def worker_process(nats_url: str, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    with service_process("worker", nats_url, **env) as proc:
        yield proc


@contextlib.contextmanager
def service_process(name: str, nats_url: str, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m services.<name>` with `SY_*` overrides; terminated (or killed) on exit."""
    full = {**os.environ, "PYTHONPATH": str(REPO), "SY_NATS_URL": nats_url, **env}
    proc = subprocess.Popen(
        [sys.executable, "-m", f"services.{name}"],
        cwd=REPO, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def ask(bus: Bus, req: GenerateRequest, *, timeout: float = 60.0) -> list[TokenFrame]:
    """Publish `req` straight to its WORK partition and collect its token stream."""
    async with TokenStreamReader(bus.nc, idle_timeout=timeout) as reader:
        await publish(bus.js, work_subject(req), req.model_copy(update={"reply": reader.inbox}))
        return [frame async for frame in reader]


@contextlib.asynccontextmanager
async def router_in_process(nats_url: str, **overrides: Any) -> AsyncIterator[Any]:
    from services.router.router import Router
    from services.router.service import load_policies
    from services.router.settings import RouterSettings

    settings = RouterSettings(nats_url=nats_url, **overrides)
    bus = await connect(settings, "test-router")
    stop = asyncio.Event()
    router = Router(bus, settings, load_policies(settings))
    task = asyncio.create_task(router.run(stop))
    try:
        yield router
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await bus.close()


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
    bus = await connect(settings, "test-preprocessor")
    stop = asyncio.Event()
    task = asyncio.create_task(run_preprocessor(bus, stop, settings))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await bus.close()
