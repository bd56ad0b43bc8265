"""A TCP proxy a test can cut: one client's connection to a server dropped and refused for
a while, the server and every other client untouched (what a client sees when its own
network path fails)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from switchyard.ports import free_port


class CuttableProxy:
    """Listens on 127.0.0.1:`port` and pipes each connection to `upstream_port`."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.server: asyncio.Server | None = None
        self.pipes: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def open(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def cut(self) -> None:
        """Drop every connection and refuse new ones until `open` again."""
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        for pipe in list(self.pipes):
            pipe.cancel()
        await asyncio.gather(*self.pipes, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.pipes.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            self.pipes.discard(task)
            return
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()
            self.pipes.discard(task)


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    with contextlib.suppress(OSError):
        dst.close()


@contextlib.asynccontextmanager
async def cuttable_proxy(upstream_port: int) -> AsyncIterator[CuttableProxy]:
    proxy = CuttableProxy(upstream_port)
    await proxy.open()
    try:
        yield proxy
    finally:
        await proxy.cut()
