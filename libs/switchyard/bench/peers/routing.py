"""The routing-quality run: the same requests through each policy onto 8 backends.

Peers: 8 `sy sim-server` backends (same settings, same seed, reset cold before each
policy) behind `vllm-router` (round_robin, cache_aware, consistent_hash) and `smg`
(cache_aware), each started fresh for its policy and stopped after it, over HTTP.
Switchyard: its own router with its shipped `switchyard` policy over 8 worker processes
running the same `sim` engine settings; requests are published straight onto NATS (the
overhead run measures the HTTP edge separately).

The workloads are `sy bench route`'s (`switchyard.bench.routeload`): `agent` (closed-loop
episodes, the session in `X-Session-ID` and `user` over HTTP and in the envelope over
NATS) and `chat` (tenants with their own system prompts, skewed traffic, conversations
and one-shot requests, no session anywhere: every router places them by their content;
vllm-router's consistent_hash then has no session key to hash).

Per policy:

- prefix-cache hit rate, token-weighted, from the backends' own counters
  (`vllm:prefix_cache_*` deltas; Switchyard: the workers' reported cached/prompt tokens);
- TTFT and end-to-end latency at the client, wall clock (streaming, first content token);
- the modelled request latency the backends report (the sim's A100-calibrated time,
  free of this machine's CPU contention): the cleanest view of what routing did to
  queueing and prefill;
- load imbalance: max/mean over backends of requests served and of modelled GPU busy
  time (`sim:busy_seconds_total`, each request's share of the engine steps it ran in);
- stickiness: mean share of an episode's (conversation's) requests on its most-used
  backend, and for chat how many backends each tenant's requests reached (which backend
  served a request: the sim server's `/sim/timings` by request id; the worker in a
  Switchyard result);
- throughput: completed requests per wall second.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from switchyard import eventloop
from switchyard.bench.peers import peers, simfleet
from switchyard.bench.peers.clients import Outcome, http_chat, nats_generate
from switchyard.bench.peers.stats import Latency, delta, hit_rate, imbalance
from switchyard.bench.peers.syfleet import POOL, switchyard_fleet
from switchyard.bench.routeload import (
    AGENT_ACT_S,
    BenchRequest,
    ChatConfig,
    Run,
    Send,
    WorkloadName,
    run_agent,
    run_chat,
)
from switchyard.fleet import ProcessGroup

SWITCHYARD = "switchyard"
PEER_POLICIES: tuple[tuple[str, str], ...] = (
    ("vllm-router", "round_robin"),
    ("vllm-router", "cache_aware"),
    ("vllm-router", "consistent_hash"),
    ("smg", "cache_aware"),
)
ALL_POLICIES = (*(f"{p} {q}" for p, q in PEER_POLICIES), SWITCHYARD)


@dataclass(frozen=True)
class RoutingConfig:
    sessions: int = 200
    steps: int = 20
    backends: int = 8
    delay_scale: float = 1.0
    seed: int = 0
    policies: tuple[str, ...] = ALL_POLICIES
    workload: WorkloadName = "agent"
    chat: ChatConfig = field(default_factory=ChatConfig)
    act_s: float = AGENT_ACT_S  # agent: modelled seconds a phone acts between steps

    @property
    def clients(self) -> int:
        """Requests in flight at most (HTTP connections needed)."""
        return self.sessions if self.workload == "agent" else self.chat.concurrency


@dataclass(frozen=True)
class PolicyRow:
    requests: int
    failed: int
    first_error: str | None
    prefix_hit_rate: float
    ttft: Latency
    e2e: Latency
    modelled_e2e: Latency
    imbalance_requests: float
    imbalance_busy: float
    stickiness: float
    tenant_backends: dict[str, int]  # backends each tenant's requests reached
    busiest_tenant: str | None
    busiest_tenant_backends: int
    throughput_rps: float
    requests_per_backend: list[int]
    wall_s: float


@dataclass(frozen=True)
class RoutingResult:
    config: RoutingConfig
    rows: dict[str, PolicyRow] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "config": asdict(self.config),
            "policies": {k: asdict(v) for k, v in self.rows.items()},
        }


async def run_workload(cfg: RoutingConfig, send: Send) -> Run:
    if cfg.workload == "agent":
        return await run_agent(cfg.sessions, cfg.steps, cfg.seed, send, cfg.act_s, cfg.delay_scale)
    return await run_chat(cfg.chat, send)


def _row(
    run: Run, served_by: Sequence[tuple[BenchRequest, Hashable]], hit: float,
    requests: Sequence[float], busy: list[float], modelled: list[float],
) -> PolicyRow:  # fmt: skip
    """`served_by`: each completed request and the backend that served it."""
    threads: defaultdict[str, list[Hashable]] = defaultdict(list)
    tenants: defaultdict[str, set[Hashable]] = defaultdict(set)
    for request, backend in served_by:
        threads[request.thread].append(backend)
        tenants[request.tenant].add(backend)
    sticky = [max(Counter(b).values()) / len(b) for b in threads.values() if len(b) > 1]
    per_tenant = Counter(r.tenant for r, _ in run.done)
    busiest = max(per_tenant, key=lambda t: (per_tenant[t], t), default=None)
    outcomes = [o for _, o in run.done]
    errors = run.errors
    return PolicyRow(
        requests=len(outcomes), failed=len(errors), first_error=errors[0] if errors else None,
        prefix_hit_rate=round(hit, 4),
        ttft=Latency.of([o.ttft_s for o in outcomes if o.ttft_s is not None]),
        e2e=Latency.of([o.total_s for o in outcomes]),
        modelled_e2e=Latency.of(modelled),
        imbalance_requests=round(imbalance(requests), 3),
        imbalance_busy=round(imbalance(busy), 3),
        stickiness=round(statistics.fmean(sticky), 4) if sticky else 0.0,
        tenant_backends={t: len(b) for t, b in sorted(tenants.items())},
        busiest_tenant=busiest,
        busiest_tenant_backends=len(tenants[busiest]) if busiest else 0,
        throughput_rps=round(len(outcomes) / run.wall_s, 1) if run.wall_s else 0.0,
        requests_per_backend=[int(r) for r in requests],
        wall_s=round(run.wall_s, 1),
    )  # fmt: skip


async def _peer_policy(
    cfg: RoutingConfig, group: ProcessGroup, backends: list[str], peer: str, policy: str
) -> PolicyRow:
    cmd = peers.command(peer, backends, policy)
    async with httpx.AsyncClient(timeout=60) as admin:
        await simfleet.reset(admin, backends)
        before = await simfleet.scrape(admin, backends)
        child = await peers.start(group, cmd)
        try:
            limits = httpx.Limits(max_connections=cfg.clients + 8)
            async with httpx.AsyncClient(base_url=cmd.url, limits=limits, timeout=300) as http:

                async def send(request: BenchRequest) -> Outcome:
                    body = request.openai_body(simfleet.MODEL, stream=True)
                    return await http_chat(http, body, request.headers())

                run = await run_workload(cfg, send)
        finally:
            group.stop(child)
        after = await simfleet.scrape(admin, backends)
        served = await simfleet.timings(admin, backends)
    found = [(r, served[o.backend_request_id]) for r, o in run.done
             if o.backend_request_id in served]  # fmt: skip
    requests = [
        delta(b, a, "vllm:request_success_total") for b, a in zip(before, after, strict=True)
    ]
    busy = [delta(b, a, "sim:busy_seconds_total") for b, a in zip(before, after, strict=True)]
    served_by = [(r, backend) for r, (backend, _) in found]
    modelled = [float(t["total"]) for _, (_, t) in found]
    return _row(run, served_by, hit_rate(before, after), requests, busy, modelled)


async def _switchyard(cfg: RoutingConfig, log_dir: Path) -> PolicyRow:
    async with switchyard_fleet(
        log_dir, workers=cfg.backends, delay_scale=cfg.delay_scale, edge=False,
        routing_policy="switchyard",
    ) as fleet:  # fmt: skip

        async def send(request: BenchRequest) -> Outcome:
            req = request.generate_request(POOL, deadline=time.time() + 300)
            return await nats_generate(fleet.bus, req, timeout=300)

        run = await run_workload(cfg, send)
    done = run.done
    requests, busy = run.per_worker(fleet.workers)
    modelled = [o.modelled.total for _, o in done if o.modelled is not None]
    served_by: list[tuple[BenchRequest, Hashable]] = [(r, o.worker) for r, o in done]
    return _row(run, served_by, run.prefix_hit_rate(), requests, busy, modelled)


async def _measure(cfg: RoutingConfig, log_dir: Path) -> RoutingResult:
    result = RoutingResult(cfg)
    peer_runs = [(p, q) for p, q in PEER_POLICIES if f"{p} {q}" in cfg.policies]
    if peer_runs:
        with ProcessGroup(log_dir / "routing-peers") as group:
            backends = simfleet.start_sim_servers(group, cfg.backends, delay_scale=cfg.delay_scale)
            for peer, policy in peer_runs:
                result.rows[f"{peer} {policy}"] = await _peer_policy(
                    cfg, group, backends, peer, policy
                )
    if SWITCHYARD in cfg.policies:
        result.rows[SWITCHYARD] = await _switchyard(cfg, log_dir / "routing-switchyard")
    return result


def run_routing(cfg: RoutingConfig, log_dir: Path) -> RoutingResult:
    unknown = set(cfg.policies) - set(ALL_POLICIES)
    if unknown:
        raise ValueError(f"unknown policies {sorted(unknown)}; known: {list(ALL_POLICIES)}")
    return eventloop.run(_measure(cfg, log_dir))
