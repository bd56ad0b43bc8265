"""Counting the requests a service is handling, so a drain can wait for the last one."""

from __future__ import annotations

import asyncio
from types import TracebackType


class InFlight:
    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def __enter__(self) -> InFlight:
        self.count += 1
        self._idle.clear()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def drained(self, timeout: float) -> bool:
        """True once nothing is in flight; False if `timeout` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True
