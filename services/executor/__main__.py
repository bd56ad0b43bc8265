"""`python -m services.executor`: runs signed canonical SQL; the only holder of DB credentials."""

from __future__ import annotations

import asyncio

from services.executor.service import run_executor
from services.executor.settings import ExecutorSettings
from switchyard.bus.connection import Bus
from switchyard.service import ServiceExit, run_service
from switchyard.sqldb.tls import DB_TLS_EXIT, DbTlsError


def main() -> None:
    settings = ExecutorSettings()

    async def start(bus: Bus, stop: asyncio.Event) -> None:
        try:
            await run_executor(bus, stop, settings)
        except DbTlsError as exc:  # one log line and an exit status, not a traceback
            raise ServiceExit(DB_TLS_EXIT, str(exc)) from exc

    run_service("executor", settings, start)


if __name__ == "__main__":
    main()
