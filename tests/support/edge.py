"""Run the edge in-process under uvicorn on a free port (the openai SDK needs real HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import uvicorn
import yaml

from services.edge.app import create_app
from services.edge.auth import hash_key
from services.edge.settings import EdgeSettings
from tests.conftest import REPO
from tests.support.loopthread import in_thread


def write_keys(path: Path, keys: dict[str, dict[str, Any]]) -> Path:
    """`keys`: plain key -> {tenant, models?}; the file stores only hashes."""
    path.write_text(yaml.safe_dump({"keys": {hash_key(k): v for k, v in keys.items()}}))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def edge_in_process(nats_url: str, **overrides: Any) -> AsyncIterator[str]:
    """Yields the base URL (`http://127.0.0.1:<port>`)."""
    settings = EdgeSettings(nats_url=nats_url, port=free_port(), **overrides)
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=settings.port, log_level="warning",
        lifespan="on",
    )  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{settings.port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


@contextlib.contextmanager
def sim_fleet_in_thread(
    nats_url: str, pool: str, policy: Path, delay_scale: float = 0.0,
    sqlflow_dir: Path | None = None,
) -> Iterator[None]:  # fmt: skip
    """Router + `sim` worker + preprocessor on their own event loop in a thread; with
    `sqlflow_dir`, a sqlflow too (no SQL policies there: every question is answered
    `unknown_tenant` at once, without a model or a database).

    For synchronous tests (schemathesis, benchmarks) whose callers do not run an asyncio
    loop of their own while they wait on the fleet.
    """
    from switchyard.bus.connection import connect
    from switchyard.config import Settings
    from tests.support.fleet import (
        preprocessor_in_process,
        provision_pool,
        router_in_process,
        worker_in_process,
    )

    @contextlib.asynccontextmanager
    async def fleet() -> AsyncIterator[None]:
        bus = await connect(Settings(nats_url=nats_url), "sim-fleet-setup")
        await provision_pool(bus.js, pool)
        await bus.close()
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(
                router_in_process(nats_url, partitions=4, pools=[pool], tenant_policy=policy,
                                  rebalance_interval=0.2)
            )  # fmt: skip
            # The engine reads `SY_SIM_*` when the worker starts it.
            before = os.environ.get("SY_SIM_DELAY_SCALE")
            os.environ["SY_SIM_DELAY_SCALE"] = str(delay_scale)
            try:
                await stack.enter_async_context(
                    worker_in_process(nats_url, pool=pool, engine="sim", assignment="kv",
                                      worker_id=f"{pool}-w0", heartbeat_interval=0.3)
                )  # fmt: skip
            finally:
                if before is None:
                    os.environ.pop("SY_SIM_DELAY_SCALE", None)
                else:
                    os.environ["SY_SIM_DELAY_SCALE"] = before
            await stack.enter_async_context(preprocessor_in_process(nats_url, chat_pool=pool))
            if sqlflow_dir is not None:
                await stack.enter_async_context(sqlflow_without_policies(nats_url, sqlflow_dir))
            await asyncio.sleep(1.0)  # heartbeats seen, partitions assigned
            yield

    with in_thread(fleet, name=f"sim-fleet-{pool}"):
        yield


@contextlib.asynccontextmanager
async def sqlflow_without_policies(nats_url: str, where: Path) -> AsyncIterator[None]:
    from services.sqlflow.service import run_sqlflow
    from services.sqlflow.settings import SqlflowSettings
    from switchyard.bus.connection import connect

    (where / "policies").mkdir(parents=True, exist_ok=True)
    settings = SqlflowSettings(
        nats_url=nats_url, knowledge_dir=REPO / "deploy" / "knowledge",
        knowledge_index=where / "index", sql_policy_dir=where / "policies",
    )  # fmt: skip
    bus = await connect(settings, "test-sqlflow")
    stop = asyncio.Event()
    task = asyncio.create_task(run_sqlflow(bus, stop, settings))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        await bus.close()


@contextlib.asynccontextmanager
async def agent_fleet_with_edge(
    nats_url: str, bus: Any, pool: str, keys: Path, *, engine: str,
    preprocessor: dict[str, Any], edge: dict[str, Any],
) -> AsyncIterator[str]:  # fmt: skip
    """Router, one worker, preprocessor and edge for a private agent `pool`; yields the
    edge's URL once the worker's partitions are assigned."""
    from switchyard.bench.fleetproc import wait_for_workers
    from tests.support.fleet import (
        preprocessor_in_process,
        provision_pool,
        router_in_process,
        worker_in_process,
    )

    worker = f"{pool}-w0"
    await provision_pool(bus.js, pool)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(
            router_in_process(nats_url, partitions=4, pools=[pool], rebalance_interval=0.2)
        )
        await stack.enter_async_context(
            worker_in_process(nats_url, pool=pool, engine=engine, assignment="kv",
                              worker_id=worker, heartbeat_interval=0.3)
        )  # fmt: skip
        await stack.enter_async_context(
            preprocessor_in_process(nats_url, agent_pool=pool, chat_pool=pool, frame_procs=0,
                                    **preprocessor)
        )  # fmt: skip
        url = await stack.enter_async_context(
            edge_in_process(nats_url, api_keys_file=keys, chat_pool=pool, agent_pool=pool, **edge)
        )
        await wait_for_workers(bus.js, {worker}, timeout=60)
        await asyncio.sleep(1.0)  # the router has seen the heartbeat and assigned partitions
        yield url
