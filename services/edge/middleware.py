"""Pure-ASGI middleware: a request id and a trace for every request, the body cap, metrics;
and the security headers of every response (`SecurityHeaders`).

The trace is the client's W3C `traceparent` when it sent a valid one, else a new one;
it is echoed in the response so a client can find its request with `sy trace`. With
tracing on (`switchyard.otel`) the request is the edge's span, and what the edge sends
the fleet (and echoes) is that span's traceparent.

Pure ASGI (not BaseHTTPMiddleware) so streaming responses are not buffered and
a client disconnect still reaches the endpoint.
"""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.edge import metrics
from services.edge.errors import ApiError
from switchyard import otel
from switchyard.ids import new_id
from switchyard.logging import bind_request
from switchyard.tracing import continued, new_traceparent

ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/agent/step",
        "/v1/models",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    }
)


class EdgeMiddleware:
    def __init__(
        self, app: ASGIApp, max_body_bytes: int, path_caps: dict[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.path_caps = path_caps or {}  # a larger (or smaller) cap for some paths
        self.tracer = otel.tracer("edge")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_id()
        started, status = time.perf_counter(), 500
        state = scope.setdefault("state", {})
        state.update(request_id=request_id, arrived=started)
        path = scope.get("path", "")
        route = path if path in ROUTES else "other"  # bounded label cardinality
        cap = self.path_caps.get(path, self.max_body_bytes)

        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > cap):
            err = ApiError(413, f"request body over {cap} bytes", code="oversized")
            await _send_error(send, err, request_id)
            metrics.REQUESTS.labels(route, "413").inc()
            return

        # The client's trace continues in ours; an invalid header starts a new one (the
        # spec's rule, not a failed request), and so does none. Only the API is traced,
        # not the probes and scrapes.
        tracer = self.tracer if path.startswith("/v1/") else otel.OFF
        client = continued(_header(scope, b"traceparent"))
        hop = tracer.begin("edge", client, route=route, request_id=request_id)
        traceparent = hop.traceparent or new_traceparent()
        state.update(traceparent=traceparent)

        seen = 0

        async def capped_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap:  # a chunked body without Content-Length
                    raise ApiError(413, f"request body over {cap} bytes", code="oversized")
            return message

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"x-request-id" for k, _ in headers):
                    # The route may have changed it (a retry adopting an orphaned claim).
                    named = scope["state"].get("request_id", request_id)
                    headers.append((b"x-request-id", named.encode()))
                    headers.append((b"traceparent", traceparent.encode()))
                message["headers"] = headers
                metrics.LATENCY.labels(route).observe(time.perf_counter() - started)
            await send(message)

        metrics.INFLIGHT.inc()
        try:
            with bind_request(request_id, None, traceparent):  # on every log line of it
                await self.app(scope, capped_receive, send_with_id)
        finally:
            metrics.INFLIGHT.dec()
            metrics.REQUESTS.labels(route, str(status)).inc()
            if otel.http_failed(status):
                hop.fail(f"http_{status}", f"answered {status}")
            hop.end()


# On every response: no MIME sniffing (a JSON body or an uploaded text never runs as a
# script), never framed (clickjacking the console), no URL leaks to other sites.
BASE_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)


class SecurityHeaders:
    """Adds `BASE_HEADERS`, and Strict-Transport-Security when the request came over HTTPS
    (over plain HTTP a browser ignores it, and it would only mislead), to every response
    that does not set them itself. Outermost, so the body-cap refusals get them too."""

    def __init__(self, app: ASGIApp, hsts_max_age: int) -> None:
        self.app = app
        self.hsts = f"max-age={hsts_max_age}".encode() if hsts_max_age > 0 else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = list(BASE_HEADERS)
        if self.hsts is not None and scope.get("scheme") == "https":
            extra.append((b"strict-transport-security", self.hsts))

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {bytes(k).lower() for k, _ in headers}
                headers.extend((k, v) for k, v in extra if k not in present)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _send_error(send: Send, err: ApiError, request_id: str) -> None:
    body = json.dumps(err.body(request_id)).encode()
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode()),
    ]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
