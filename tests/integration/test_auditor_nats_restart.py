"""Acceptance (issue #9): restart the NATS server (file store) while audit events
flow, and no event the stream acknowledged is lost; each is stored exactly once.

A nats-server of the test's own, on a fixed port and store directory, is
stopped in the middle of the load and started again on both. The auditor (the
real `python -m services.auditor`) and the publisher must reconnect by
themselves: the same auditor process runs from start to end. Two ways down:
a graceful stop (SIGTERM), and `kill -9` of a server configured as production
configures AUDIT (`sync_interval: always`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import nats.errors
import pytest

from switchyard.bus.connection import Bus, connect
from switchyard.config import Settings
from switchyard.messages.sql import AuditEvent
from switchyard.natsserver import EmbeddedNats
from switchyard.ports import free_port
from tests.support.auditenv import (
    AuditEnv,
    AuditorProcess,
    audit_env,
    audit_stream,
    publish_event,
    sql_event,
)

TENANTS = ("acme", "nova", "orbit")
ACK_WAIT = 3.0
# Events acknowledged before the stop and after the restart: the restart is mid-load.
BEFORE, AFTER = 400, 400
DOWN_SECONDS = 1.5


class Publisher:
    """Publishes events one after another; records which got a JetStream ack, and when."""

    def __init__(self, bus: Bus, env: AuditEnv) -> None:
        self.bus = bus
        self.env = env
        self.acked: dict[str, float] = {}
        self.unacked: list[AuditEvent] = []
        self.sent: list[AuditEvent] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            event = sql_event(TENANTS[i % len(TENANTS)], i)
            i += 1
            self.sent.append(event)
            if not await self.try_publish(event):
                self.unacked.append(event)
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.002)

    async def try_publish(self, event: AuditEvent) -> bool:
        try:
            await publish_event(self.bus.js, self.env, event, timeout=1.0)
        except (nats.errors.Error, TimeoutError):
            # No ack: maybe stored, maybe not. Retried later under the same id.
            return False
        self.acked[event.id] = time.monotonic()
        return True

    async def retry_unacked(self, timeout: float) -> None:
        """Publish again, under the same message id, every event that got no ack."""
        deadline = time.monotonic() + timeout
        for event in self.unacked:
            while not await self.try_publish(event):
                assert time.monotonic() < deadline, "publishes are still not acknowledged"
                await asyncio.sleep(0.2)

    def acked_between(self, start: float, end: float) -> int:
        return sum(1 for at in self.acked.values() if start <= at < end)


@pytest.fixture(params=["sigterm", "kill9"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A file-store nats-server on a fixed port; `kill9` runs with `sync_interval: always`."""
    srv = EmbeddedNats(data_dir=tmp_path / "nats", port=free_port(),
                       sync_always=request.param == "kill9")  # fmt: skip
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


async def _until(
    what: str, check: Callable[[], Awaitable[bool]], timeout: float, auditor: AuditorProcess
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        assert auditor.alive, f"the auditor died waiting for {what}:\n{auditor.tail()}"
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; auditor log:\n{auditor.tail()}")


async def test_nats_restart_mid_load_loses_no_acked_event(
    server: EmbeddedNats, mysql_dsn: str, unique: str, tmp_path: Path
) -> None:
    how = "kill9" if server.sync_always else "sigterm"
    with audit_env(mysql_dsn, unique, server.url, audit_batch=50,
                   audit_ack_wait=ACK_WAIT) as env:  # fmt: skip
        bus = await connect(Settings(nats_url=server.url), "test-publisher")
        auditor = AuditorProcess(env, tmp_path / "auditor.log")
        try:
            await audit_stream(bus.js, env, ack_wait=ACK_WAIT)
            await asyncio.to_thread(auditor.start)
            publisher = Publisher(bus, env)
            pub_task = asyncio.create_task(publisher.run())

            async def loaded() -> bool:
                return len(publisher.acked) >= BEFORE and await asyncio.to_thread(env.count) > 0

            await _until("the auditor to store under load", loaded, 30, auditor)
            stopped_at = time.monotonic()
            rows_at_stop = await asyncio.to_thread(env.count)
            if how == "kill9":
                assert server.proc is not None
                server.proc.kill()
                server.proc.wait(10)
                server.proc = None
            else:
                await asyncio.to_thread(server.stop)
            await asyncio.sleep(DOWN_SECONDS)
            await asyncio.to_thread(server.start)
            restarted_at = time.monotonic()

            async def acked_after() -> bool:
                return publisher.acked_between(restarted_at, time.monotonic()) >= AFTER

            await _until("publishes acknowledged after the restart", acked_after, 30, auditor)
            publisher.stop.set()
            await pub_task
            unacked_first = len(publisher.unacked)
            await publisher.retry_unacked(timeout=20)
            total = len(publisher.sent)

            async def drained() -> bool:
                if await asyncio.to_thread(env.count) < total:
                    return False
                info = await bus.js.consumer_info(env.stream, env.settings.audit_durable)
                return info.num_pending == 0 and info.num_ack_pending == 0

            await _until(f"{total} rows stored", drained, 40, auditor)
            await asyncio.sleep(0.5)  # a late duplicate would show up now
            # The same auditor process, reconnected: it never died or restarted.
            assert auditor.alive, auditor.tail()
            log = auditor.log.read_text()
            assert "nats.disconnected" in log and "nats.reconnected" in log, auditor.tail()
            drained_at = time.monotonic()
        finally:
            await asyncio.to_thread(auditor.stop)
            await bus.close()

        # The restart happened mid-load, not before or after it.
        assert publisher.acked_between(0, stopped_at) >= BEFORE
        assert publisher.acked_between(restarted_at, drained_at) >= AFTER
        assert 0 < rows_at_stop < total
        # Every acknowledged event, and after the retries every event, exactly once.
        ids = await asyncio.to_thread(env.event_ids)
        assert len(ids) == len(set(ids)) == total
        assert set(publisher.acked) <= set(ids)
        assert set(ids) == {e.id for e in publisher.sent}
        report = await asyncio.to_thread(env.verify)
        assert report.ok and report.rows == total, report
        print(
            f"\nnats restart ({how}): {total} events, {rows_at_stop} rows at the stop, "
            f"{unacked_first} publishes unacknowledged during the outage and retried"
        )
