"""The event loop every Switchyard process runs on: uvloop (libuv) where it installs.

Every hop of a request is a few NATS messages handled by an asyncio loop in each process;
on libuv the loop's own share of that work (polling, socket writes, timers) costs less
CPU per message than asyncio's selector loop, and on a busy host that CPU is latency.
Where uvloop does not install (Windows) asyncio's own loop runs the same code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

try:
    import uvloop
except ImportError:  # pragma: no cover - not on the platforms the fleet runs on
    uvloop = None  # type: ignore[assignment]

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on uvloop when it is there."""
    if uvloop is None:  # pragma: no cover
        return asyncio.run(main)
    return uvloop.run(main)
