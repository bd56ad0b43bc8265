"""The validator and executor services in the test process, on the session's NATS and the
private MariaDB of `sqlenv`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from services.executor.service import run_executor
from services.executor.settings import ExecutorSettings
from services.validator.service import run_validator
from services.validator.settings import ValidatorSettings
from switchyard import subjects
from switchyard.fleet.inproc import InprocGroup
from switchyard.fleet.readiness import wait_for_responder
from tests.support.sqlenv import SqlEnv


@contextlib.asynccontextmanager
async def sql_services(nats_url: str, sqlenv: SqlEnv, **executor: Any) -> AsyncIterator[None]:
    """Yields once both answer requests; `executor` overrides the executor's settings
    (see `SqlEnv.settings`)."""
    vset = ValidatorSettings(
        nats_url=nats_url, sql_signing_key=sqlenv.signing_key, sql_policy_dir=sqlenv.policy_dir
    )
    eset = sqlenv.settings(ExecutorSettings, nats_url=nats_url, **executor)
    async with InprocGroup() as group:
        await group.run("test-validator", vset, lambda bus, stop: run_validator(bus, stop, vset))
        await group.run("test-executor", eset, lambda bus, stop: run_executor(bus, stop, eset))
        nc = group.connection("test-validator").nc
        for subject in (subjects.SQL_VALIDATE, subjects.SQL_EXECUTE):
            await wait_for_responder(nc, subject, timeout=30, check=group.check)
        yield
