"""`python -m services.edge`: the HTTP edge under uvicorn (`services.edge.server`; SIGTERM
drains via uvicorn); HTTPS when given a certificate (SY_HTTPS_CERT, SY_HTTPS_KEY)."""

from __future__ import annotations

import contextlib
import sys

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from services.edge.app import create_app
from services.edge.server import server_config
from services.edge.settings import EdgeSettings
from switchyard import otel
from switchyard.logging import configure
from switchyard.metrics import serve_metrics


def main() -> None:
    settings = EdgeSettings()
    configure(settings.log_level, service="edge")
    serve_metrics(settings.metrics_port)  # /metrics is also served on the HTTP port
    server = uvicorn.Server(server_config(settings, create_app(settings)))
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl-C is a stop
        server.run()
    otel.shutdown()  # the spans still queued go to the collector
    if not server.started:
        sys.exit(STARTUP_FAILURE)


if __name__ == "__main__":
    main()
