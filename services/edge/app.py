"""The edge's FastAPI app: authenticate, validate, publish to the fleet, stream the reply.

It never runs a model. `create_app` assembles the routers of `services.edge.routes`
(OpenAI, agent, SQL, ops, console), the middleware (request id, trace, body caps,
metrics) and the error handlers that give every refusal OpenAI's error shape; its
lifespan connects to NATS and makes the `EdgeState` the routes are handed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.edge.auth import KeyRing
from services.edge.errors import ApiError
from services.edge.idempotency import Idempotency
from services.edge.middleware import EdgeMiddleware, SecurityHeaders
from services.edge.routes import agent, console, openai, ops, sql
from services.edge.settings import EdgeSettings
from services.edge.state import EdgeState, request_id
from switchyard.bus.connection import Bus, connect
from switchyard.logging import get_logger

log = get_logger(__name__)


def create_app(settings: EdgeSettings, bus: Bus | None = None) -> FastAPI:
    """The app; with `bus` it uses that connection, else it connects on start-up (and
    closes it on shutdown)."""
    # A bad key file fails here, not per request; later edits are picked up while serving.
    keys = KeyRing.load(settings.api_keys_file, settings.api_keys_reload_interval,
                        published=settings.env == "local")  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        live = bus if bus is not None else await connect(settings, "edge")
        app.state.edge = EdgeState(settings, keys, live, Idempotency(live))
        try:
            yield
        finally:
            del app.state.edge  # a restarted lifespan makes (and connects) a new one
            if bus is None:
                await live.close()

    app = FastAPI(
        title="Switchyard edge",
        version="1",
        description="OpenAI-compatible HTTP edge of the Switchyard fleet.",
        lifespan=lifespan,
    )
    for routes in (console, ops, openai, agent, sql):
        app.include_router(routes.router)
    app.add_middleware(
        EdgeMiddleware,
        max_body_bytes=settings.max_body_bytes,
        path_caps={"/v1/agent/step": settings.max_agent_body_bytes},
    )
    app.add_middleware(SecurityHeaders, hsts_max_age=settings.hsts_max_age)  # the outermost
    app.exception_handler(ApiError)(on_api_error)
    app.exception_handler(StarletteHTTPException)(on_http)
    app.exception_handler(RequestValidationError)(on_invalid)
    return app


async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
    rid = request_id(request) or None
    if exc.status >= 500:
        log.warning("edge.error", status=exc.status, code=exc.code, reason=exc.message)
    return JSONResponse(exc.body(rid), exc.status, headers=exc.headers(rid))


async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """FastAPI's own refusals (unparseable JSON body, unknown route, wrong method) in
    OpenAI's error shape with the request id, like every other error."""
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    response = await on_api_error(request, ApiError(exc.status_code, str(exc.detail), kind))
    response.headers.update(exc.headers or {})  # e.g. a 405's Allow
    return response


async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    err = ApiError(422, f"{where}: {first.get('msg', 'invalid request')}", param=where or None)
    return await on_api_error(request, err)
