"""`python -m services.preprocessor`: ingress -> prepared, schedulable requests."""

from __future__ import annotations

import asyncio

from services.preprocessor.service import run_preprocessor
from services.preprocessor.settings import PreprocessorSettings
from switchyard.bus.connection import Bus
from switchyard.service import run_service


def main() -> None:
    settings = PreprocessorSettings()

    async def start(bus: Bus, stop: asyncio.Event) -> None:
        await run_preprocessor(bus, stop, settings)

    run_service("preprocessor", settings, start)


if __name__ == "__main__":
    main()
