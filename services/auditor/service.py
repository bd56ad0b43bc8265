"""The auditor process: AUDIT -> the append-only audit table, batched and idempotent.

`PullLoop` runs up to `audit_batch` handlers at once; each decodes and redacts
its event and hands the row to the `Batcher`, which writes whatever has
gathered (up to `audit_batch` rows, or after `audit_linger`) in one
transaction and only then lets the handlers return, so every message is acked
after the commit that stored it. A failed batch fails all its handlers: the
messages are nak'ed and redelivered, and the event-id key makes the retry
harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import pymysql
from nats.aio.msg import Msg

from services.auditor import metrics
from services.auditor.settings import AuditorSettings
from services.auditor.store import AuditWriter, Row, kind_of, to_row
from switchyard.backoff import Backoff
from switchyard.bus.connection import Bus
from switchyard.bus.consumer import PullLoop, RetryPolicy
from switchyard.codec import decode
from switchyard.logging import get_logger
from switchyard.messages.sql import AuditEvent
from switchyard.sqldb.tls import DbTlsError

log = get_logger(__name__)

# While the database is away: from ~0.2 s (a restart) up to 5 s between tries.
DB_RETRY = Backoff(first=0.2, cap=5.0)

Write = Callable[[list[Row]], int]


class Batcher:
    """Gathers rows from concurrent handlers and writes them in one transaction per batch."""

    def __init__(self, write: Write, *, max_batch: int, linger: float) -> None:
        self.write = write
        self.max_batch = max_batch
        self.linger = linger
        self._pending: list[tuple[Row, asyncio.Future[None]]] = []
        self._full = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def submit(self, row: Row) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((row, fut))
        if len(self._pending) >= self.max_batch:
            self._full.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._flush_soon())
        await fut

    async def _flush_soon(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._full.wait(), self.linger)
        async with self._lock:
            while self._pending:
                batch, self._pending = (
                    self._pending[: self.max_batch],
                    self._pending[self.max_batch :],
                )
                self._full.clear()
                await self._flush(batch)

    async def _flush(self, batch: list[tuple[Row, asyncio.Future[None]]]) -> None:
        started = time.perf_counter()
        failures = 0
        while True:
            try:
                inserted = await asyncio.to_thread(self.write, [row for row, _ in batch])
                break
            except (pymysql.err.OperationalError, pymysql.err.InterfaceError, DbTlsError) as exc:
                # The database is away (or lost its TLS): keep the messages (PullLoop keeps
                # them in progress) rather than burn their deliveries into the dead letters.
                metrics.FAILURES.inc()
                delay = DB_RETRY.delay(failures)
                failures += 1
                log.warning(
                    "audit.db_unavailable", size=len(batch), error=repr(exc), retry=round(delay, 3)
                )
                await asyncio.sleep(delay)
            except Exception as exc:
                metrics.FAILURES.inc()
                log.error("audit.batch_failed", size=len(batch), error=repr(exc))
                if len(batch) > 1:  # one bad row must not take its batch-mates down with it
                    for one in batch:
                        await self._flush([one])
                    return
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                return
        metrics.BATCH_SECONDS.observe(time.perf_counter() - started)
        metrics.STORED.inc(inserted)
        metrics.DUPLICATES.inc(len(batch) - inserted)
        for _, fut in batch:
            if not fut.done():
                fut.set_result(None)


async def run_auditor(bus: Bus, stop: asyncio.Event, settings: AuditorSettings) -> None:
    writer = AuditWriter(settings)
    # A database that wants TLS we cannot give stops the auditor here (DbTlsError); one
    # that is away only warns: the batcher keeps the events until it is back.
    if not await asyncio.to_thread(writer.check_login):
        log.warning("auditor.db_login_failed", mysql=f"{settings.mysql_host}:{settings.mysql_port}")
    batcher = Batcher(writer.write, max_batch=settings.audit_batch, linger=settings.audit_linger)

    async def handle(msg: Msg) -> None:
        event = decode(msg.data, AuditEvent)  # DecodeError -> dead letter, with the reason
        await batcher.submit(to_row(event, kind_of(msg.subject)))

    loop = PullLoop(
        bus.js, settings.audit_stream, settings.audit_durable, handle,
        retry=RetryPolicy(settings.audit_max_deliver), ack_wait=settings.audit_ack_wait,
        max_inflight=settings.audit_batch * settings.audit_inflight_batches,
        drain_timeout=settings.drain_timeout,
    )  # fmt: skip
    runner = asyncio.create_task(loop.run())
    log.info(
        "auditor.ready",
        stream=settings.audit_stream,
        mysql=f"{settings.mysql_host}:{settings.mysql_port}",
        db=settings.sql_audit_db,
        batch=settings.audit_batch,
        tls=writer.tls is not None,
    )
    try:
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({runner, stopped}, return_when=asyncio.FIRST_COMPLETED)
        loop.stop()
        stopped.cancel()
        await runner
    finally:
        await asyncio.to_thread(writer.close)
