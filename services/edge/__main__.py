"""`python -m services.edge`: the HTTP edge under uvicorn (SIGTERM drains via uvicorn);
HTTPS when given a certificate (SY_HTTPS_CERT, SY_HTTPS_KEY)."""

from __future__ import annotations

import uvicorn

from services.edge.app import create_app
from services.edge.settings import EdgeSettings
from switchyard.logging import configure
from switchyard.metrics import serve_metrics


def main() -> None:
    settings = EdgeSettings()
    configure(settings.log_level, service="edge")
    serve_metrics(settings.metrics_port)  # /metrics is also served on the HTTP port
    uvicorn.run(
        create_app(settings), host=settings.host, port=settings.port,
        log_level=settings.log_level, access_log=False, timeout_graceful_shutdown=20,
        **settings.uvicorn_tls(),
    )  # fmt: skip


if __name__ == "__main__":
    main()
