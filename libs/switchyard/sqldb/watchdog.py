"""A watchdog that sends `KILL QUERY` for a statement still running past its deadline.

It kills from a second connection of the same account: a MySQL/MariaDB user may
kill its own threads without PROCESS or CONNECTION ADMIN, so the tenant
account needs no extra privilege (one connection per tenant is kept free for
it, see `sql_pool_size` vs `MAX_USER_CONNECTIONS`). It is the backstop for a
server-side limit that did not fire (a MySQL statement that
`max_execution_time` does not cover, a session that changed its own limit).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from switchyard.logging import get_logger
from switchyard.sqldb.connection import DbConnection

log = get_logger(__name__)


@dataclass
class Watch:
    thread_id: int
    fired: bool = False
    error: str | None = None


class Watchdog:
    def __init__(self, connect: Callable[[], Awaitable[DbConnection]]) -> None:
        self._connect = connect

    async def _fire(self, watch: Watch, after: float) -> None:
        await asyncio.sleep(after)
        try:
            conn = await self._connect()
            try:
                async with conn.raw.cursor() as cur:
                    await cur.execute(f"KILL QUERY {int(watch.thread_id)}")
                watch.fired = True
                log.warning("sql.watchdog_killed", thread_id=watch.thread_id, after=after)
            finally:
                conn.close()
        except Exception as exc:  # the client deadline is the last resort then
            watch.error = f"{type(exc).__name__}: {exc}"
            log.error("sql.watchdog_failed", thread_id=watch.thread_id, error=watch.error)

    @contextlib.asynccontextmanager
    async def guard(self, thread_id: int, after: float) -> AsyncIterator[Watch]:
        """Kill `thread_id`'s running statement if the block is still running `after` s on."""
        watch = Watch(thread_id)
        task = asyncio.create_task(self._fire(watch, after))
        try:
            yield watch
        finally:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
