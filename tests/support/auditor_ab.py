"""Side-by-side benchmark of the auditor process: events/s draining a backlog with one
batch in flight versus two (`SY_AUDIT_INFLIGHT_BATCHES`), runs interleaved, medians.

    python -m tests.support.auditor_ab [PAIRS] [EVENTS]

Needs MariaDB at `SY_MYSQL_DSN` (default root@127.0.0.1:3306); starts its own
nats-server per run. Not a test: it asserts nothing and prints the ratio.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from switchyard.bus.connection import connect
from switchyard.config import Settings
from switchyard.natsserver import EmbeddedNats
from tests.support.auditenv import (
    AuditorProcess,
    audit_env,
    audit_stream,
    publish_event,
    sql_event,
)

DSN = os.environ.get("SY_MYSQL_DSN", "mysql://root@127.0.0.1:3306")
TENANTS = ("acme", "nova", "orbit", "zen")


async def drain_rate(inflight: int, n: int) -> float:
    """Events/s from the auditor's start until `n` backlogged events are stored."""
    tmp = Path(tempfile.mkdtemp(prefix="auditor-ab-"))
    with (
        EmbeddedNats(data_dir=tmp / "nats") as srv,
        audit_env(
            DSN, uuid.uuid4().hex[:10], srv.url, audit_batch=200, audit_ack_wait=30.0
        ) as env,  # fmt: skip
    ):
        bus = await connect(Settings(nats_url=srv.url), "auditor-ab")
        try:
            await audit_stream(bus.js, env, ack_wait=30.0)
            events = [sql_event(TENANTS[i % len(TENANTS)], i) for i in range(n)]
            for s in range(0, n, 200):
                await asyncio.gather(*(publish_event(bus.js, env, e) for e in events[s : s + 200]))
        finally:
            await bus.close()
        proc = AuditorProcess(env, tmp / "auditor.log", audit_inflight_batches=str(inflight))
        await asyncio.to_thread(proc.start)
        started = time.monotonic()
        conn = env.admin()
        try:
            while env.count(conn) < n:
                await asyncio.sleep(0.02)
        finally:
            conn.close()
            proc.stop()
        return n / (time.monotonic() - started)


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 6000
    rates: dict[int, list[float]] = {1: [], 2: []}
    for r in range(pairs):
        for inflight in (1, 2) if r % 2 == 0 else (2, 1):  # alternate who goes first
            rates[inflight].append(asyncio.run(drain_rate(inflight, n)))
            print(f"inflight batches {inflight}: {rates[inflight][-1]:.0f} events/s", flush=True)
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    print(f"median events/s: 1 batch in flight {one:.0f}, 2 batches {two:.0f}, "
          f"ratio {two / one:.2f} ({pairs} interleaved pairs of {n} events)")  # fmt: skip


if __name__ == "__main__":
    main()
