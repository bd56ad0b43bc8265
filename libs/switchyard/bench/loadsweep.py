"""`sy bench load` as a function: one run per load of a sweep, then the knee and report.

Connects to the target (a NATS URL, or the edge's base URL with an API key), runs
each load of the sweep in ascending order with the same seed (so every load sees
the same request mix), and summarises. A fresh run id per invocation keeps a
second sweep on the same fleet from finding the first one's prompts cached.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from switchyard import eventloop
from switchyard.bench.arrival import Arrival, ArrivalKind, schedule
from switchyard.bench.knee import MIN_GAIN
from switchyard.bench.loadgen import Hooks, LoadConfig, Target, run_load
from switchyard.bench.loadreport import SweepMeta, SweepResult, build_result, write
from switchyard.bench.loadstats import RunStats, Slo, summarise
from switchyard.bench.workloads import AgentShape, ChatShape, Kind, Workload, WorkloadName
from switchyard.ids import new_id

TargetKind = Literal["nats", "edge"]


@dataclass(frozen=True)
class SweepConfig:
    loads: Sequence[float]  # req/s (open loop) or users (closed loop), any order
    target: TargetKind = "nats"
    nats_url: str = "nats://127.0.0.1:4222"
    edge_url: str = "http://127.0.0.1:8080"
    api_key: str = "sk-local-dev"
    workload: WorkloadName = "chat"
    arrival: ArrivalKind = "poisson"
    burst: int = 8
    duration_s: float = 20.0
    warmup_s: float = 3.0
    seed: int = 0
    request_timeout_s: float = 60.0
    slo: Slo = field(default_factory=Slo)
    replicas: int = 1
    gpu_price_per_hour: float = 2.0
    fleet: str = "an externally started fleet"
    tenants: Mapping[Kind, str] = field(default_factory=dict)
    weights: Mapping[Kind, float] | None = None
    chat: ChatShape = field(default_factory=ChatShape)
    agent: AgentShape = field(default_factory=AgentShape)
    pause_s: float = 1.0  # between loads: let the previous load's stragglers clear
    knee_min_gain: float = MIN_GAIN  # see `switchyard.bench.knee`
    notes: Sequence[str] = ()

    def __post_init__(self) -> None:
        if not self.loads or any(x <= 0 for x in self.loads):
            raise ValueError(f"a sweep needs positive loads, got {list(self.loads)}")
        if len(set(self.loads)) != len(self.loads):
            raise ValueError(f"sweep loads repeat: {list(self.loads)}")
        if self.arrival == "closed" and any(x != int(x) for x in self.loads):
            raise ValueError("closed-loop loads are user counts (integers)")
        if self.replicas < 1 or self.gpu_price_per_hour < 0:
            raise ValueError("replicas must be >= 1 and the GPU price >= 0")

    def arrival_at(self, load: float) -> Arrival:
        if self.arrival == "closed":
            return Arrival("closed", concurrency=int(load))
        return Arrival(self.arrival, rate=load, burst=self.burst)

    def expected_requests(self, load: float) -> int | None:
        """Requests a load sends (open loop), for a progress bar; None for a closed loop."""
        a = self.arrival_at(load)
        return len(schedule(a, self.warmup_s + self.duration_s, self.seed)) if a.open else None


HooksFor = Callable[[float, int | None], Hooks]


async def sweep_target(
    cfg: SweepConfig, target: Target, hooks_for: HooksFor | None = None
) -> list[RunStats]:
    """Every load of `cfg` against `target`, lightest first."""
    run = new_id().lower()[-8:]
    out: list[RunStats] = []
    for i, load in enumerate(sorted(cfg.loads)):
        if i:
            await asyncio.sleep(cfg.pause_s)
        arrival = cfg.arrival_at(load)
        workload = Workload(
            cfg.workload, seed=cfg.seed, tenants=cfg.tenants, weights=cfg.weights,
            chat=cfg.chat, agent=cfg.agent, run=f"{run}-{i}",
        )  # fmt: skip
        lc = LoadConfig(arrival, cfg.duration_s, cfg.warmup_s, cfg.seed, cfg.request_timeout_s)
        hooks = hooks_for(load, cfg.expected_requests(load)) if hooks_for else None
        records = await run_load(target, workload, lc, hooks)
        out.append(summarise(
            records, label=arrival.label(), load=load, open_loop=arrival.open,
            warmup_s=cfg.warmup_s, duration_s=cfg.duration_s, slo=cfg.slo,
        ))  # fmt: skip
    return out


async def _sweep(cfg: SweepConfig, hooks_for: HooksFor | None) -> list[RunStats]:
    if cfg.target == "nats":
        from switchyard.bench.loadtargets import NatsTarget
        from switchyard.bus.connection import connect
        from switchyard.config import Settings

        async with await connect(Settings(nats_url=cfg.nats_url), "sy-bench-load") as bus:
            return await sweep_target(cfg, NatsTarget(bus, idle_timeout=cfg.request_timeout_s),
                                      hooks_for)  # fmt: skip
    import httpx

    from switchyard.bench.loadtargets import EdgeTarget

    # No connection cap: a pool limit would queue requests inside the client, hidden.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(
        base_url=cfg.edge_url, headers={"Authorization": f"Bearer {cfg.api_key}"},
        timeout=cfg.request_timeout_s, limits=limits,
    ) as http:  # fmt: skip
        return await sweep_target(cfg, EdgeTarget(http), hooks_for)


def run_sweep(
    cfg: SweepConfig, out: Path | None = None, hooks_for: HooksFor | None = None
) -> SweepResult:
    """Run the sweep; with `out`, write report.md, sweep.json and the PNGs."""
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    t0 = time.perf_counter()
    runs = eventloop.run(_sweep(cfg, hooks_for))
    target = "NATS" if cfg.target == "nats" else f"the edge ({cfg.edge_url})"
    notes = list(cfg.notes)
    if cfg.arrival == "closed":
        notes.append(
            "closed loop: users wait for their answer before sending, so a slow fleet lowers "
            "its own arrival rate - queueing and the knee are understated; use an open loop "
            "for capacity"
        )
    notes.append(f"sweep wall time {time.perf_counter() - t0:.1f} s")
    meta = SweepMeta(
        target=target, workload=cfg.workload, arrival=cfg.arrival, fleet=cfg.fleet,
        replicas=cfg.replicas, gpu_price_per_hour=cfg.gpu_price_per_hour,
        duration_s=cfg.duration_s, warmup_s=cfg.warmup_s, seed=cfg.seed, started_at=started,
        notes=notes, knee_min_gain=cfg.knee_min_gain,
    )  # fmt: skip
    result = build_result(meta, runs)
    if out is not None:
        from switchyard.bench.plots import write_plots

        write(result, out, write_plots(result, out))
    return result
