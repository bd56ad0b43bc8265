"""Run one sim server under uvicorn (what `sy sim-server` does)."""

from __future__ import annotations

import uvicorn

from switchyard.engines.sim import SimSettings
from switchyard.simserver.app import create_app


def run_sim_server(
    settings: SimSettings, *, host: str, port: int, model: str, log_level: str = "warning"
) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn drains in-flight requests, then the engine closes)."""
    config = uvicorn.Config(
        create_app(settings, model), host=host, port=port, log_level=log_level,
        access_log=False, lifespan="on",
    )  # fmt: skip
    uvicorn.Server(config).run()
