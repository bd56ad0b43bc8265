"""Acceptance (issue #9): `kill -9` the auditor process in the middle of a burst of
10,000 audit events, restart it, and the table holds each event exactly once,
`sy audit verify` passes, and a row tampered with afterwards makes it fail.

The auditor is the real `python -m services.auditor`, on the session's
nats-server and the local MariaDB, with a private stream, database and account.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js import JetStreamContext
from prometheus_client import Counter
from typer.testing import CliRunner

from services.auditor import metrics
from switchyard.bus.connection import Bus
from switchyard.cli.app import app
from switchyard.messages.sql import AuditEvent
from switchyard.ports import free_port
from tests.support.auditenv import (
    AuditEnv,
    AuditorProcess,
    audit_env,
    audit_stream,
    publish_event,
    sql_event,
)

TENANTS = ("acme", "nova", "orbit", "zen")
TOTAL = 10_000
# The auditor is killed once this many rows are committed: well inside the burst.
KILL_AT = 1_500
# The burst: 10,000 events at up to 1,000/s, so it lasts about 10 s.
RATE, CHUNK = 1_000, 50
# Short, so the events the killed process held unacked come back within seconds.
ACK_WAIT = 3.0


@pytest.fixture
def env(mysql_dsn: str, unique: str, nats_url: str) -> Iterator[AuditEnv]:
    with audit_env(
        mysql_dsn, unique, nats_url, audit_batch=200, audit_linger=0.02, audit_ack_wait=ACK_WAIT
    ) as e:
        yield e


async def _publish_all(js: JetStreamContext, env: AuditEnv, events: list[AuditEvent]) -> int:
    """Publish every event and wait for each JetStream ack: chunks of CHUNK in flight,
    at most RATE events/s, so the burst lasts long enough to kill the auditor inside it."""
    acked = 0

    async def one(event: AuditEvent) -> None:
        nonlocal acked
        await publish_event(js, env, event, timeout=10)
        acked += 1

    for start in range(0, len(events), CHUNK):
        began = time.monotonic()
        await asyncio.gather(*(one(e) for e in events[start : start + CHUNK]))
        await asyncio.sleep(max(0.0, CHUNK / RATE - (time.monotonic() - began)))
    return acked


async def _drained(bus: Bus, env: AuditEnv, total: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(env.count) >= total:
            info = await bus.js.consumer_info(env.stream, env.settings.audit_durable)
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not drained in {timeout}s: {env.count()} of {total} rows")


def _counter(port: int, counter: Counter) -> float:
    """A counter's value on the auditor process's `/metrics`."""
    name = f"{counter.describe()[0].name}_total"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["audit", *args], env={"COLUMNS": "200", "NO_COLOR": "1"})
    return result.exit_code, result.output


async def test_kill9_mid_burst_then_restart_stores_each_event_once(
    bus: Bus, env: AuditEnv, tmp_path: Path
) -> None:
    await audit_stream(bus.js, env, ack_wait=ACK_WAIT, max_ack_pending=1000)
    events = [sql_event(TENANTS[i % len(TENANTS)], i) for i in range(TOTAL)]
    log = tmp_path / "auditor.log"
    first = AuditorProcess(env, log)
    await asyncio.to_thread(first.start)
    second: AuditorProcess | None = None
    try:
        publisher = asyncio.create_task(_publish_all(bus.js, env, events))
        # Watch the table; once KILL_AT rows are stored, kill -9 right after the next
        # commit shows up, while that batch's acks are likely still on their way.
        watch = env.admin()
        try:
            first_row_at: float | None = None
            first_rows = 0
            armed: int | None = None  # the count once KILL_AT was reached
            while True:
                stored = await asyncio.to_thread(env.count, watch)
                now = time.monotonic()
                if stored and first_row_at is None:
                    first_row_at, first_rows = now, stored
                if armed is not None and stored > armed:
                    break
                if armed is None and stored >= KILL_AT:
                    armed = stored
                assert first.alive, f"the auditor died on its own:\n{first.tail()}"
                assert now - (first_row_at or now) < 60, "the auditor stores nothing"
                await asyncio.sleep(0.002 if armed is not None else 0.02)
        finally:
            watch.close()
        first.kill9()
        killed_at = time.monotonic()
        at_kill = await bus.js.consumer_info(env.stream, env.settings.audit_durable)
        published_at_kill = await _stream_messages(bus.js, env)
        # A COMMIT the server received just before the kill still completes: let it land.
        await asyncio.sleep(0.3)
        rows_at_kill = await asyncio.to_thread(env.count)
        assert first_row_at is not None
        rate = (stored - first_rows) / max(1e-9, killed_at - first_row_at)
        # The crash really was mid-burst: some rows stored, far from all, and the
        # publisher still at work.
        assert 0 < rows_at_kill < TOTAL, rows_at_kill
        assert published_at_kill < TOTAL and not publisher.done(), published_at_kill

        assert await publisher == TOTAL  # every event has its JetStream ack
        # Nothing moves while no auditor runs.
        assert await asyncio.to_thread(env.count) == rows_at_kill

        metrics_port = free_port()
        restarted = time.monotonic()
        second = AuditorProcess(env, log, metrics_port=str(metrics_port))
        await asyncio.to_thread(second.start)
        await _drained(bus, env, TOTAL, timeout=60)
        drain_seconds = time.monotonic() - restarted
        await asyncio.sleep(0.5)  # a late duplicate would show up now
        duplicates = _counter(metrics_port, metrics.DUPLICATES)
        stored_after = _counter(metrics_port, metrics.STORED)
    finally:
        for proc in (first, second):
            if proc is not None:
                await asyncio.to_thread(proc.stop)

    # Each event exactly once: no duplicate, none missing.
    ids = await asyncio.to_thread(env.event_ids)
    assert len(ids) == TOTAL
    assert len(set(ids)) == TOTAL
    assert set(ids) == {e.id for e in events}
    # The restarted auditor stored exactly what the killed one had not.
    assert stored_after == TOTAL - rows_at_kill

    print(
        f"\nauditor crash: stored {rate:.0f} events/s before the kill; "
        f"{rows_at_kill} rows at kill -9 ({published_at_kill} of {TOTAL} events published); "
        f"drained {TOTAL - rows_at_kill} more in {drain_seconds:.1f}s after restart "
        f"(ack_wait {ACK_WAIT}s); {at_kill.num_ack_pending} events held unacked by the killed "
        f"process; redelivered events already stored (skipped) {duplicates:.0f}"
    )

    # The chain verifies, through the CLI.
    code, out = _cli("verify", "--dsn", env.dsn, "--db", env.db)
    assert code == 0 and "OK" in out and f"{TOTAL} row(s) in {len(TENANTS)}" in out, out

    # Tamper with one row as root: verify names the tenant and the row.
    conn = env.admin()
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"UPDATE `{env.db}`.sql_audit SET verdict = 'rejected' "
                "WHERE tenant = 'nova' AND seq = 1234"
            )
            assert cur.rowcount == 1
            cur.execute(f"SELECT id FROM `{env.db}`.sql_audit WHERE tenant = 'nova' AND seq = 1234")
            row_id = cur.fetchone()[0]
    finally:
        conn.close()
    code, out = _cli("verify", "--dsn", env.dsn, "--db", env.db)
    assert code == 1, out
    assert "BROKEN" in out and "tenant nova, seq 1234" in out and f"row id {row_id}" in out, out
    assert "verdict" in out, out


async def _stream_messages(js: JetStreamContext, env: AuditEnv) -> int:
    info = await js.stream_info(env.stream)
    return int(info.state.messages)
