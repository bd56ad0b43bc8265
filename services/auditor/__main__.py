"""`python -m services.auditor`: AUDIT -> the append-only, hash-chained audit table."""

from __future__ import annotations

import asyncio

from services.auditor.service import run_auditor
from services.auditor.settings import AuditorSettings
from switchyard.bus.connection import Bus
from switchyard.service import ServiceExit, run_service
from switchyard.sqldb.tls import DB_TLS_EXIT, DbTlsError


def main() -> None:
    settings = AuditorSettings()

    async def start(bus: Bus, stop: asyncio.Event) -> None:
        try:
            await run_auditor(bus, stop, settings)
        except DbTlsError as exc:  # one log line and an exit status, not a traceback
            raise ServiceExit(DB_TLS_EXIT, str(exc)) from exc

    run_service("auditor", settings, start)


if __name__ == "__main__":
    main()
