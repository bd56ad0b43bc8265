"""The whole Text2SQL path in one test process: validator, executor, router, a llama.cpp
worker on the `sql` pool, and sqlflow, on the session's NATS and the private MariaDB."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext

from services.sqlflow.service import DURABLE, run_sqlflow
from services.sqlflow.settings import SqlflowSettings
from switchyard.bus.connection import Bus
from switchyard.fleet.errors import NotReady
from switchyard.fleet.inproc import running
from switchyard.fleet.readiness import POLL, Check, PoolReady, wait_for_pools
from switchyard.text2sql.embedding import shared_embedder
from switchyard.text2sql.index import KnowledgeIndex
from tests.conftest import REPO
from tests.support.fleet import provision_pool, router_in_process, worker_in_process
from tests.support.sqlenv import SqlEnv
from tests.support.sqlservices import sql_services

KNOWLEDGE = REPO / "deploy" / "knowledge"


async def wait_for_pull(
    js: JetStreamContext, stream: str, durable: str, *, timeout: float, check: Check
) -> None:
    """Until the service behind `durable` has a pull request waiting: it is consuming."""
    deadline = time.monotonic() + timeout
    while True:
        check()
        info = await js.consumer_info(stream, durable)
        if info.num_waiting:
            return
        if time.monotonic() > deadline:
            raise NotReady(f"nothing pulled from {stream}/{durable} within {timeout:.0f} s")
        await asyncio.sleep(POLL)


@dataclass
class Flow:
    settings: SqlflowSettings
    index: KnowledgeIndex


@contextlib.asynccontextmanager
async def sqlflow_in_process(
    nats_url: str, sqlenv: SqlEnv, index_dir: Path, **overrides: Any
) -> AsyncIterator[Flow]:
    values: dict[str, Any] = {"knowledge_dir": KNOWLEDGE, "knowledge_index": index_dir,
                              "sql_policy_dir": sqlenv.policy_dir, **overrides}  # fmt: skip
    settings = SqlflowSettings(nats_url=nats_url, **values)
    index = KnowledgeIndex(shared_embedder(), path=index_dir)
    try:
        async with running(
            "test-sqlflow", settings, lambda bus, stop: run_sqlflow(bus, stop, settings, index)
        ) as group:
            js = group.connection("test-sqlflow").js
            await wait_for_pull(js, "INGRESS", DURABLE, timeout=60, check=group.check)
            yield Flow(settings, index)
    finally:
        index.close()


@contextlib.asynccontextmanager
async def text2sql_fleet(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, index_dir: Path, unique: str,
    executor: dict[str, Any] | None = None, **flow: Any,
) -> AsyncIterator[Flow]:  # fmt: skip
    """Everything a question needs, with a private `sql` pool for this test."""
    pool = f"q{unique}"
    await provision_pool(bus.js, pool)
    since = time.time()
    async with (
        # the production EXPLAIN-gate thresholds (sqlenv's defaults are test-size)
        sql_services(nats_url, sqlenv, **{"sql_explain_max_rows": 50_000,
                                          "sql_explain_large_table_rows": 20_000,
                                          **(executor or {})}),
        router_in_process(nats_url, partitions=4, pools=[pool], rebalance_interval=0.2),
        worker_in_process(nats_url, pool=pool, engine="llamacpp", assignment="kv",
                          worker_id=f"{pool}-w0", heartbeat_interval=0.3),
        sqlflow_in_process(nats_url, sqlenv, index_dir, sql_pool=pool, **flow) as running,
    ):  # fmt: skip
        ready = PoolReady(pool, 1, 4, worker_ids=(f"{pool}-w0",))
        await wait_for_pools(bus.js, [ready], since=since, timeout=120)
        yield running
