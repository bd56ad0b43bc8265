"""`python -m services.router`: admission, fair scheduling and placement."""

from __future__ import annotations

import asyncio

from services.router.service import run_router
from services.router.settings import RouterSettings
from switchyard.bus.connection import Bus
from switchyard.service import run_service


def main() -> None:
    settings = RouterSettings()

    async def start(bus: Bus, stop: asyncio.Event) -> None:
        await run_router(bus, stop, settings)

    run_service(f"router-{settings.router_id}", settings, start)


if __name__ == "__main__":
    main()
