"""Waiting in a test for a state it can observe, with a deadline, instead of a sleep.

A sleep "long enough" for something to happen wastes seconds or, on a loaded 2-core
machine, is not long enough. Poll what the test then relies on. Sleep only to prove
that something does NOT happen within a window, and say so where you do. For a fleet
being ready, use `switchyard.fleet.readiness` (or `tests.support.fleet.wait_for_pool`).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

POLL = 0.05  # s between two looks


async def until(
    condition: Callable[[], bool | Awaitable[bool]], *, timeout: float, what: str,
    every: float = POLL,
) -> None:  # fmt: skip
    """Until `condition()` holds (awaited if it returns an awaitable); `TimeoutError`
    naming `what` if it still does not after `timeout` seconds. `condition` may raise to
    fail at once (e.g. when the process it waits on died)."""
    deadline = time.monotonic() + timeout
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(every)


def until_blocking(
    condition: Callable[[], bool], *, timeout: float, what: str, every: float = 0.2
) -> None:
    """`until` for a synchronous test."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(every)
