"""`python -m services.executor`: runs signed canonical SQL; the only holder of DB credentials."""

from __future__ import annotations

import asyncio

from services.executor.service import run_executor
from services.executor.settings import ExecutorSettings
from switchyard.bus.connection import Bus
from switchyard.service import run_service


def main() -> None:
    settings = ExecutorSettings()

    async def start(bus: Bus, stop: asyncio.Event) -> None:
        await run_executor(bus, stop, settings)

    run_service("executor", settings, start)


if __name__ == "__main__":
    main()
