"""`python -m services.worker`: one inference worker (one per GPU)."""

from __future__ import annotations

import asyncio

from services.worker.service import run_worker
from services.worker.settings import WorkerSettings
from switchyard.bus.connection import Bus
from switchyard.service import run_service


def main() -> None:
    settings = WorkerSettings()

    async def start(bus: Bus, stop: asyncio.Event) -> None:
        await run_worker(bus, stop, settings)

    run_service(f"worker-{settings.worker_id}", settings, start)


if __name__ == "__main__":
    main()
