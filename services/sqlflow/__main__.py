"""`python -m services.sqlflow`: the Text2SQL orchestrator."""

from __future__ import annotations

import asyncio

from services.sqlflow.service import run_sqlflow
from services.sqlflow.settings import SqlflowSettings
from switchyard.bus.connection import Bus
from switchyard.probes import Probes
from switchyard.service import run_service


def main() -> None:
    settings = SqlflowSettings()
    probes = Probes()  # the service's checks, and started and ready once its pipeline is
    built = probes.pending("pipeline", "opening the knowledge index")

    async def start(bus: Bus, stop: asyncio.Event) -> None:
        await run_sqlflow(bus, stop, settings, built=built)

    run_service("sqlflow", settings, start, probes)


if __name__ == "__main__":
    main()
