"""`services.edge.server.CoalescingTransport`: the writes of one event-loop turn reach the
socket as one write. Every edge test runs the edge over it too (`server_config`, with
uvicorn's real protocol and sockets); here each rule is checked against a transport that
records what it is given."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.edge.server import CoalescingTransport

pytestmark = pytest.mark.unit


class Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1234)}.get(name, default)


async def turn() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_one_turns_writes_leave_as_one_write_at_its_end() -> None:
    inner = Recording()
    t = CoalescingTransport(inner)
    t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    t.write(memoryview(b"{}"))
    assert inner.writes == []  # held until the turn ends
    await turn()
    assert inner.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]


async def test_writes_of_later_turns_are_not_held_back() -> None:
    inner = Recording()
    t = CoalescingTransport(inner)
    for chunk in (b"data: 1\n\n", b"data: 2\n\n"):
        t.writelines([chunk])
        await turn()
    assert inner.writes == [b"data: 1\n\n", b"data: 2\n\n"]


async def test_close_writes_what_is_held_first() -> None:
    inner = Recording()
    t = CoalescingTransport(inner)
    t.write(b"last words")
    t.close()
    assert inner.writes == [b"last words"] and inner.closed
    await turn()  # the scheduled flush finds nothing left to write
    assert inner.writes == [b"last words"]


async def test_a_connection_closed_meanwhile_gets_nothing_and_the_rest_is_delegated() -> None:
    inner = Recording()
    t = CoalescingTransport(inner)
    t.write(b"too late")
    inner.close()  # the client went away before the turn ended
    await turn()
    assert inner.writes == []
    assert t.is_closing() and t.get_extra_info("peername") == ("127.0.0.1", 1234)
