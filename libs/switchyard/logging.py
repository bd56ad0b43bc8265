"""Structured JSON logs; every line carries the request id, tenant and trace id in scope.

Bind them once per message with `bind_request(...)` (contextvars, so concurrent
tasks keep their own) and every log call underneath carries them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog

from switchyard.tracing import trace_id

_configured = False


def configure(level: str = "info", *, service: str = "switchyard", json: bool = True) -> None:
    global _configured
    renderer: Any = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
    _configured = True


def get_logger(name: str) -> Any:
    return structlog.get_logger(logger_name=name)


@contextmanager
def bind_request(
    request_id: str | None, tenant: str | None = None, trace: str | None = None
) -> Iterator[None]:
    """Scope log fields to one request; restores the previous values on exit."""
    tokens = structlog.contextvars.bind_contextvars(
        request_id=request_id, tenant=tenant, trace_id=trace_id(trace)
    )
    try:
        yield
    finally:
        structlog.contextvars.reset_contextvars(**tokens)
