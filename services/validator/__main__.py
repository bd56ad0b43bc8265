"""`python -m services.validator`: the SQL validator (a pure function with a signing key)."""

from __future__ import annotations

import asyncio

from services.validator.service import run_validator
from services.validator.settings import ValidatorSettings
from switchyard.bus.connection import Bus
from switchyard.service import run_service


def main() -> None:
    settings = ValidatorSettings()

    async def start(bus: Bus, stop: asyncio.Event) -> None:
        await run_validator(bus, stop, settings)

    run_service("validator", settings, start)


if __name__ == "__main__":
    main()
