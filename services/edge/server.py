"""The edge's HTTP server: uvicorn, configured in one place, writing each response once.

uvicorn writes a response's status line and headers when the app sends
`http.response.start`, and its body when it sends `http.response.body`: two socket writes
for every answer, each a syscall (on loopback the sender's write also runs the receiver's
TCP path) and often a segment of its own the client reads separately. Under
`sy bench peers overhead` py-spy put a fifth of the edge's CPU in those writes.
`CoalescingTransport` holds what one turn of the event loop writes and gives it to the
socket at the end of that turn, in one write: a whole JSON answer leaves as one segment,
and an SSE chunk still leaves as soon as the loop is free (within the same turn).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from services.edge.settings import EdgeSettings


class CoalescingTransport:
    """`transport`, except that the writes of one event-loop turn reach it as one write.

    Everything else (close, flow control, extra info) is the transport's own; `close`
    first writes what is held, so a response is never cut short."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._held:
            asyncio.get_running_loop().call_soon(self._flush)
        self._held.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        if not self._held:
            return
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held.clear()
        if not self._transport.is_closing():  # the client went away meanwhile
            self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol over a `CoalescingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(cast(asyncio.Transport, CoalescingTransport(transport)))


def server_config(
    settings: EdgeSettings, app: ASGIApp, *, host: str | None = None, log_level: str | None = None
) -> uvicorn.Config:
    """uvicorn's config for the edge: its address, HTTPS when given a certificate, no access
    log (the edge logs and counts requests itself), 20 s to drain on SIGTERM."""
    return uvicorn.Config(
        app, host=host or settings.host, port=settings.port,
        log_level=log_level or settings.log_level, lifespan="on", access_log=False,
        timeout_graceful_shutdown=20, http=CoalescingHttpTools, **settings.uvicorn_tls(),
    )  # fmt: skip
