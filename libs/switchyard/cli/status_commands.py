"""`sy status`: the live workers as their heartbeats in KV `fleet_workers` describe them."""

from __future__ import annotations

import json
import time

import typer
from rich.table import Table

from switchyard.bus.kvread import KvUnreadable, latest_values
from switchyard.bus.topology import WORKERS_BUCKET
from switchyard.cli import console
from switchyard.cli.bus_commands import NatsUrl, _settings, cli_connect, run_or_exit
from switchyard.errors import SwitchyardError
from switchyard.messages.fleet import WorkerHeartbeat

READ_TIMEOUT = 5.0  # s: a one-shot command may wait longer than the console's poll


async def live_workers(nats_url: str | None) -> list[WorkerHeartbeat]:
    """Every worker with a heartbeat in KV (the bucket's TTL drops the dead), by pool."""
    async with await cli_connect(_settings(nats_url), "sy-status") as bus:
        try:
            beats = await latest_values(bus.js, WORKERS_BUCKET, ">", WorkerHeartbeat,
                                        READ_TIMEOUT)  # fmt: skip
        except KvUnreadable as exc:
            raise SwitchyardError(str(exc), code="no_capacity") from exc
    return sorted(beats, key=lambda b: (b.pool, b.worker))


def register(app: typer.Typer) -> None:
    @app.command()
    def status(
        nats_url: NatsUrl = None,
        as_json: bool = typer.Option(False, "--json", help="one JSON object per worker, a list"),
    ) -> None:
        """The live workers: pool, role, where the GPU sits, load, KV, partitions."""
        beats = run_or_exit(live_workers(nats_url))
        now = time.time()
        if as_json:
            print(json.dumps([{**b.model_dump(mode="json"), "age": round(now - b.at, 3)}
                              for b in beats]))  # fmt: skip
            return
        t = Table("pool", "worker", "role", "topology", "engine", "running / slots",
                  "waiting", "KV used", "prefix hits", "partitions", "age")  # fmt: skip
        for b in beats:
            t.add_row(
                b.pool, b.worker + (" (draining)" if b.draining else ""), b.role,
                b.topology or "-", b.engine, f"{b.running} / {b.slots}", str(b.waiting),
                f"{b.kv_cache_usage:.0%}", f"{b.prefix_hit_rate:.0%}",
                str(len(b.partitions)), f"{max(0.0, now - b.at):.1f} s",
            )  # fmt: skip
        if not beats:
            console.print("no live workers: none has a heartbeat in KV fleet_workers")
            return
        console.print(t)
