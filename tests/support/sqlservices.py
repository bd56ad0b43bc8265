"""The validator and executor services in the test process, on the session's NATS and the
private MariaDB of `sqlenv`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from services.executor.service import run_executor
from services.executor.settings import ExecutorSettings
from services.validator.service import run_validator
from services.validator.settings import ValidatorSettings
from switchyard.bus.connection import connect
from tests.support.sqlenv import SqlEnv


@contextlib.asynccontextmanager
async def sql_services(nats_url: str, sqlenv: SqlEnv, **executor: Any) -> AsyncIterator[None]:
    """`executor` overrides the executor's settings (see `SqlEnv.settings`)."""
    vset = ValidatorSettings(
        nats_url=nats_url, sql_signing_key=sqlenv.signing_key, sql_policy_dir=sqlenv.policy_dir
    )
    eset = sqlenv.settings(ExecutorSettings, nats_url=nats_url, **executor)
    stop = asyncio.Event()
    buses = [await connect(vset, "test-validator"), await connect(eset, "test-executor")]
    tasks = [
        asyncio.create_task(run_validator(buses[0], stop, vset)),
        asyncio.create_task(run_executor(buses[1], stop, eset)),
    ]
    await asyncio.sleep(0.2)
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        for b in buses:
            await b.close()
