"""`python -m services.auditor`: AUDIT -> the append-only, hash-chained audit table."""

from __future__ import annotations

import asyncio

from services.auditor.service import run_auditor
from services.auditor.settings import AuditorSettings
from switchyard.bus.connection import Bus
from switchyard.service import run_service


def main() -> None:
    settings = AuditorSettings()

    async def start(bus: Bus, stop: asyncio.Event) -> None:
        await run_auditor(bus, stop, settings)

    run_service("auditor", settings, start)


if __name__ == "__main__":
    main()
