"""A Switchyard fleet as processes for the peers benchmark: NATS, router, sim workers,
and optionally the preprocessor and the HTTP edge.

The same services `sy up` runs (`python -m services.<name>`), each its own process like the
peers' routers and backends, on a private pool and an embedded `nats-server`, with a
permissive tenant policy (the benchmark measures routing, not quotas).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import yaml

from switchyard.bench.fleetproc import nats_for_bench, wait_for_workers
from switchyard.bench.peers.procs import ProcessGroup, free_port
from switchyard.bus.connection import Bus, connect
from switchyard.bus.provision import provision
from switchyard.bus.topology import TopologySettings, build_topology

POOL = "peers"
TENANT = "bench"
KEY = "sk-bench-peers"  # a throwaway key for this run's private edge
PARTITIONS = 64


@dataclass(frozen=True)
class SwitchyardFleet:
    nats_url: str
    bus: Bus
    edge_url: str | None
    workers: list[str]


def _env(nats_url: str, **extra: str) -> dict[str, str]:
    return {"SY_NATS_URL": nats_url, "SY_LOG_LEVEL": "warning", "SY_PARTITIONS": str(PARTITIONS),
            **extra}  # fmt: skip


@contextlib.asynccontextmanager
async def switchyard_fleet(
    group: ProcessGroup, *, workers: int, delay_scale: float, edge: bool,
    kv_blocks: int | None = None, max_num_seqs: int | None = None,
) -> AsyncIterator[SwitchyardFleet]:  # fmt: skip
    from services.edge.auth import hash_key

    with nats_for_bench(None) as nats_url:
        tmp = group.log_dir
        policy = tmp / "tenants.yaml"
        policy.write_text(yaml.safe_dump({"default": {
            "itpm": 10**12, "otpm": 10**12, "max_queued_tokens": 10**12,
            "max_concurrency": 100_000}}))  # fmt: skip
        topo = TopologySettings(nats_url=nats_url, partitions=PARTITIONS, pools=[POOL])
        bus = await connect(topo, "sy-bench-peers")
        names: list[str] = []
        try:
            await provision(bus.js, build_topology(topo))
            python = [sys.executable, "-m"]
            group.start("sy-router", [*python, "services.router"], _env(
                nats_url, SY_POOLS=json.dumps([POOL]), SY_TENANT_POLICY=str(policy),
                SY_REBALANCE_INTERVAL="0.5"))  # fmt: skip
            sim: dict[str, str] = {"SY_SIM_DELAY_SCALE": str(delay_scale)}
            if kv_blocks is not None:
                sim["SY_SIM_KV_CAPACITY_TOKENS"] = str(kv_blocks * 16)
            if max_num_seqs is not None:
                sim["SY_SIM_MAX_NUM_SEQS"] = str(max_num_seqs)
            for i in range(workers):
                name = f"{POOL}-w{i}"
                names.append(name)
                group.start(f"sy-worker-{i}", [*python, "services.worker"], _env(
                    nats_url, SY_POOL=POOL, SY_ENGINE="sim", SY_ASSIGNMENT="kv",
                    SY_WORKER_ID=name, SY_HEARTBEAT_INTERVAL="0.5", **sim))  # fmt: skip
            await _wait_workers(group, bus, set(names))
            edge_url = None
            if edge:
                keys = tmp / "keys.yaml"
                keys.write_text(yaml.safe_dump({"keys": {hash_key(KEY): {"tenant": TENANT}}}))
                group.start("sy-preprocessor", [*python, "services.preprocessor"],
                            _env(nats_url, SY_CHAT_POOL=POOL))  # fmt: skip
                port = free_port()
                child = group.start("sy-edge", [*python, "services.edge"], _env(
                    nats_url, SY_PORT=str(port), SY_API_KEYS_FILE=str(keys), SY_CHAT_POOL=POOL,
                    SY_MAX_TOKENS_CAP="4096"))  # fmt: skip
                edge_url = f"http://127.0.0.1:{port}"
                await asyncio.to_thread(group.wait_http, child, f"{edge_url}/healthz", 90)
            yield SwitchyardFleet(nats_url, bus, edge_url, names)
        finally:
            # Stop the fleet before its NATS goes away, so services drain instead of reconnecting.
            group.close()
            await bus.close()


async def _wait_workers(group: ProcessGroup, bus: Bus, names: set[str]) -> None:
    waiting = asyncio.create_task(wait_for_workers(bus.js, names, timeout=120))
    while not waiting.done():
        for child in group.children:
            if not child.alive():
                waiting.cancel()
                raise child.failure(f"exited with status {child.proc.returncode} at start")
        await asyncio.sleep(0.3)
    waiting.result()


def edge_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}
