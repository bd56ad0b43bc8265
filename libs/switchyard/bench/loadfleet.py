"""A fleet for a load test, as processes on this machine: `sy bench load --fleet sim:8`.

An embedded NATS, the router (with an unmetered tenant policy: the test measures the
fleet, not the default quotas), `workers` worker processes per pool the workload
needs, the preprocessor and, for `--target edge`, the edge with a throwaway API key.
Every service is its own `python -m services.<name>` process, as under `sy up`.
The SQL path (sqlflow, validator, executor, a database) is not started here: run
`make up` and point `--nats`/`--edge-url` at it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import cast

from switchyard.fleet import UNMETERED, Edge, FleetSpec, Pool, launch
from switchyard.fleet.spec import Engine

EDGE_KEY = "sk-bench-load"  # valid only for the edge this module starts
TENANT = "bench"
POOL_OF = {"chat": "llm", "agent": "agent"}
READY_TIMEOUT = 300.0  # s: llama.cpp workers load their model on a shared machine


class FleetSpecError(ValueError):
    """A `--fleet` value that is not `ENGINE:WORKERS` for a startable engine and workload."""


@dataclass(frozen=True)
class LocalFleet:
    engine: Engine = "sim"
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


def parse_fleet(spec: str, workload: str) -> tuple[Engine, int, tuple[str, ...]]:
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
    return cast(Engine, engine), int(n), tuple(POOL_OF[k] for k in kinds)


@contextlib.contextmanager
def local_fleet(fleet: LocalFleet) -> Iterator[tuple[str, str | None]]:
    """Yields (NATS URL, edge base URL or None) once the fleet is ready: every partition
    bound by a live worker, the edge answering `/readyz`."""
    spec = FleetSpec(
        pools=tuple(Pool(pool, fleet.workers, fleet.env) for pool in fleet.pools),
        engine=fleet.engine, tenant_policy=UNMETERED,
        service_env={"preprocessor": {"SY_FRAME_PROCS": "1"}},
        edge=Edge(keys={EDGE_KEY: TENANT}) if fleet.edge else None,
    )  # fmt: skip
    with launch(spec, ready_timeout=READY_TIMEOUT) as running:
        yield running.nats_url, running.edge_url
