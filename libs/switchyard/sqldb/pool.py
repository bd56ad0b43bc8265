"""A bounded connection pool that answers "busy" instead of queueing without bound.

A request waits at most `busy_timeout` for a connection; then it gets `Busy`
(code `no_capacity`) and the caller answers at once. A broken connection is
discarded on release, never handed out again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from switchyard.errors import SwitchyardError
from switchyard.sqldb.connection import DbConnection


class Busy(SwitchyardError):
    code = "no_capacity"


class Pool:
    def __init__(
        self,
        name: str,
        connect: Callable[[], Awaitable[DbConnection]],
        *,
        size: int,
        busy_timeout: float,
    ) -> None:
        self.name = name
        self.size = size
        self.busy_timeout = busy_timeout
        self._connect = connect
        self._slots = asyncio.Semaphore(size)
        self._idle: list[DbConnection] = []

    async def _take_slot(self) -> None:
        if not self._slots.locked():
            await self._slots.acquire()
            return
        if self.busy_timeout <= 0:
            raise Busy(f"{self.name}: all {self.size} connections are busy")
        try:
            await asyncio.wait_for(self._slots.acquire(), self.busy_timeout)
        except TimeoutError as exc:
            raise Busy(
                f"{self.name}: all {self.size} connections busy for {self.busy_timeout:.3f}s"
            ) from exc

    async def acquire(self) -> DbConnection:
        await self._take_slot()
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
            conn = await self._connect()
        except BaseException:
            self._slots.release()
            raise
        return conn

    def release(self, conn: DbConnection, *, discard: bool = False) -> None:
        if discard or conn.closed:
            with contextlib.suppress(Exception):
                conn.close()
        else:
            self._idle.append(conn)
        self._slots.release()

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Lease]:
        conn = await self.acquire()
        lease = Lease(conn)
        try:
            yield lease
        finally:
            self.release(conn, discard=lease.broken)

    def close(self) -> None:
        while self._idle:
            with contextlib.suppress(Exception):
                self._idle.pop().close()


class Lease:
    """A connection on loan; mark it `broken` and the pool drops it on return."""

    def __init__(self, conn: DbConnection) -> None:
        self.conn = conn
        self.broken = False
