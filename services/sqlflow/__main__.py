"""`python -m services.sqlflow`: the Text2SQL orchestrator."""

from __future__ import annotations

import asyncio

from services.sqlflow.service import run_sqlflow
from services.sqlflow.settings import SqlflowSettings
from switchyard.bus.connection import Bus
from switchyard.service import run_service


def main() -> None:
    settings = SqlflowSettings()

    async def start(bus: Bus, stop: asyncio.Event) -> None:
        await run_sqlflow(bus, stop, settings)

    run_service("sqlflow", settings, start)


if __name__ == "__main__":
    main()
