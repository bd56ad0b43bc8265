"""A fleet for a load test, as processes on this machine: `sy bench load --fleet sim:8`.

An embedded NATS, the router (with an unmetered tenant policy: the test measures the
fleet, not the default quotas), `workers` worker processes per pool the workload
needs, the preprocessor and, for `--target edge`, the edge with a throwaway API key.
Every service is its own `python -m services.<name>` process, as under `sy up`.
The SQL path (sqlflow, validator, executor, a database) is not started here: run
`make up` and point `--nats`/`--edge-url` at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from switchyard.bench.fleetproc import nats_for_bench, service_processes, wait_for_workers
from switchyard.bus.connection import connect
from switchyard.bus.provision import provision
from switchyard.bus.topology import TopologySettings, build_topology
from switchyard.config import Settings

EDGE_KEY = "sk-bench-load"  # valid only for the edge this module starts
TENANT = "bench"
UNMETERED = {"itpm": 10**12, "otpm": 10**12, "max_concurrency": 10**6,
             "max_queued_tokens": 10**12}  # fmt: skip
POOL_OF = {"chat": "llm", "agent": "agent"}


class FleetSpecError(ValueError):
    """A `--fleet` value that is not `ENGINE:WORKERS` for a startable engine and workload."""


@dataclass(frozen=True)
class LocalFleet:
    engine: str = "sim"
    workers: int = 1  # per pool
    pools: tuple[str, ...] = ("llm",)
    edge: bool = False
    env: Mapping[str, str] = field(default_factory=dict)  # extra SY_* for the workers

    def describe(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        sim = " (a simulator of a vLLM GPU engine, not a GPU)" if self.engine == "sim" else ""
        pools = "/".join(self.pools)
        text = (
            f"{self.workers} {self.engine} worker process(es){sim} per pool {pools} on this machine"
        )
        return text + (f" [{extra}]" if extra else "")


def parse_fleet(spec: str, workload: str) -> tuple[str, int, tuple[str, ...]]:
    """`sim:8` -> ("sim", 8, pools the workload needs)."""
    engine, _, n = spec.partition(":")
    if engine not in ("sim", "llamacpp") or not n.isdigit() or int(n) < 1:
        raise FleetSpecError(f"--fleet must be sim:N or llamacpp:N (N >= 1), got {spec!r}")
    kinds = ("chat", "agent") if workload == "mixed" else (workload,)
    if "sql" in kinds:
        raise FleetSpecError(
            "the sql workload needs the Text2SQL services and a database: run `make up` and "
            "use --nats/--edge-url instead of --fleet"
        )
    return engine, int(n), tuple(POOL_OF[k] for k in kinds)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _provision(url: str, pools: tuple[str, ...]) -> None:
    bus = await connect(Settings(nats_url=url), "sy-bench-load-provision")
    try:
        await provision(bus.js, build_topology(TopologySettings(nats_url=url, pools=list(pools))))
    finally:
        await bus.close()


async def _wait(url: str, ids: set[str]) -> None:
    bus = await connect(Settings(nats_url=url), "sy-bench-load-wait")
    try:
        await wait_for_workers(bus.js, ids, timeout=300)
    finally:
        await bus.close()


def _wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.3)
    raise TimeoutError(f"the edge at {url} was not ready within {timeout}s")


@contextlib.contextmanager
def local_fleet(fleet: LocalFleet) -> Iterator[tuple[str, str | None]]:
    """Yields (NATS URL, edge base URL or None) once every worker holds partitions."""
    from services.edge.auth import hash_key

    with contextlib.ExitStack() as stack:
        url = stack.enter_context(nats_for_bench(None))
        asyncio.run(_provision(url, fleet.pools))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sy-bench-load-")))
        policy = tmp / "tenants.yaml"
        policy.write_text(yaml.safe_dump({"default": UNMETERED}))
        pools_json = "[" + ",".join(f'"{p}"' for p in fleet.pools) + "]"
        router = {"SY_POOLS": pools_json, "SY_REBALANCE_INTERVAL": "0.5",
                  "SY_TENANT_POLICY": str(policy), "SY_ROUTER_ID": "r0"}  # fmt: skip
        stack.enter_context(service_processes("router", url, [router]))
        ids = {f"{pool}-w{i}" for pool in fleet.pools for i in range(fleet.workers)}
        workers = [
            {"SY_ENGINE": fleet.engine, "SY_POOL": pool, "SY_ASSIGNMENT": "kv",
             "SY_WORKER_ID": f"{pool}-w{i}", "SY_HEARTBEAT_INTERVAL": "0.5", **fleet.env}
            for pool in fleet.pools for i in range(fleet.workers)
        ]  # fmt: skip
        stack.enter_context(service_processes("worker", url, workers))
        stack.enter_context(service_processes("preprocessor", url, [{"SY_FRAME_PROCS": "1"}]))
        asyncio.run(_wait(url, ids))
        edge_url: str | None = None
        if fleet.edge:
            keys = tmp / "keys.yaml"
            keys.write_text(yaml.safe_dump({"keys": {hash_key(EDGE_KEY): {"tenant": TENANT}}}))
            port = _free_port()
            stack.enter_context(service_processes("edge", url, [
                {"SY_API_KEYS_FILE": str(keys), "SY_PORT": str(port)}]))  # fmt: skip
            edge_url = f"http://127.0.0.1:{port}"
            _wait_http(edge_url)
        time.sleep(1.0)  # the router has seen the heartbeats and assigned every partition
        yield url, edge_url
