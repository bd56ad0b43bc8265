"""The routing-quality run: the same agent episodes through each policy onto 8 backends.

Peers: 8 `sy sim-server` backends (same settings, same seed, reset cold before each
policy) behind `vllm-router` (round_robin, cache_aware, consistent_hash) and `smg`
(cache_aware), each started fresh for its policy and stopped after it. Switchyard: its own
router with session-affinity placement (bounded-load consistent hashing of partitions) over
8 worker processes running the same `sim` engine settings; steps are published straight
onto NATS (the overhead run measures the HTTP edge separately).

Per policy:

- prefix-cache hit rate, token-weighted, from the backends' own counters
  (`vllm:prefix_cache_*` deltas; Switchyard: the workers' reported cached/prompt tokens);
- TTFT and end-to-end latency at the client, wall clock (streaming, first content token);
- the modelled step latency the backends report (the sim's A100-calibrated time, free of
  this machine's CPU contention): the cleanest view of what routing did to queueing and
  prefill;
- load imbalance: max/mean over backends of requests served and of modelled busy time;
- throughput: completed steps per wall second.

Episodes are closed loops started together: step k+1 is sent when step k's answer is
complete, and the answer joins the history (the sim answers deterministically per prompt,
so every policy sees the same prompts).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from switchyard.bench.peers import peers, simfleet
from switchyard.bench.peers.clients import Outcome, http_chat, nats_generate
from switchyard.bench.peers.stats import Latency, delta, hit_rate, imbalance
from switchyard.bench.peers.syfleet import POOL, TENANT, switchyard_fleet
from switchyard.bench.peers.workload import AgentStep
from switchyard.fleet import ProcessGroup
from switchyard.ports import free_port

SWITCHYARD = "switchyard affinity"
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


@dataclass(frozen=True)
class PolicyRow:
    steps: int
    failed: int
    first_error: str | None
    prefix_hit_rate: float
    ttft: Latency
    e2e: Latency
    modelled_e2e: Latency
    imbalance_requests: float
    imbalance_busy: float
    throughput_steps_per_s: float
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


Send = Callable[[AgentStep], Awaitable[Outcome]]


@dataclass
class _Run:
    done: list[Outcome] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0


async def run_episodes(cfg: RoutingConfig, send: Send) -> _Run:
    run = _Run()

    async def episode(session: int) -> None:
        history: list[str] = []
        for step in range(cfg.steps):
            try:
                outcome = await send(AgentStep(cfg.seed, session, step, tuple(history)))
            except Exception as e:  # counted, reported; the episode goes on like a phone would
                run.errors.append(f"{type(e).__name__}: {e}"[:300])
                history.append("(no answer)")
                continue
            run.done.append(outcome)
            history.append(outcome.text)

    started = time.perf_counter()
    await asyncio.gather(*(episode(s) for s in range(cfg.sessions)))
    run.wall_s = time.perf_counter() - started
    return run


def _row(
    run: _Run, hit: float, requests: list[float], busy: list[float], modelled: list[float]
) -> PolicyRow:
    return PolicyRow(
        steps=len(run.done), failed=len(run.errors),
        first_error=run.errors[0] if run.errors else None,
        prefix_hit_rate=round(hit, 4),
        ttft=Latency.of([o.ttft_s for o in run.done if o.ttft_s is not None]),
        e2e=Latency.of([o.total_s for o in run.done]),
        modelled_e2e=Latency.of(modelled),
        imbalance_requests=round(imbalance(requests), 3),
        imbalance_busy=round(imbalance(busy), 3),
        throughput_steps_per_s=round(len(run.done) / run.wall_s, 1) if run.wall_s else 0.0,
        requests_per_backend=[int(r) for r in requests],
        wall_s=round(run.wall_s, 1),
    )  # fmt: skip


async def _peer_policy(
    cfg: RoutingConfig, group: ProcessGroup, backends: list[str], peer: str, policy: str
) -> PolicyRow:
    make = peers.vllm_router if peer == "vllm-router" else peers.smg
    port = free_port()
    cmd = make(port, free_port(), backends, policy)
    async with httpx.AsyncClient(timeout=60) as admin:
        await simfleet.reset(admin, backends)
        before = await simfleet.scrape(admin, backends)
        child = group.start(cmd.name.replace(" ", "-"), cmd.argv, cmd.env)
        try:
            url = f"http://127.0.0.1:{port}"
            await asyncio.to_thread(group.wait_http, child, url + cmd.health_path, 90)
            limits = httpx.Limits(max_connections=cfg.sessions + 8)
            async with httpx.AsyncClient(base_url=url, limits=limits, timeout=300) as http:

                async def send(step: AgentStep) -> Outcome:
                    body = step.openai_body(simfleet.MODEL, stream=True)
                    return await http_chat(http, body, step.headers())

                run = await run_episodes(cfg, send)
        finally:
            group.stop(child)
        after = await simfleet.scrape(admin, backends)
        served = await simfleet.timings(admin, backends)
    modelled = [served[o.backend_request_id][1]["total"] for o in run.done
                if o.backend_request_id in served]  # fmt: skip
    requests = [
        delta(b, a, "vllm:request_success_total") for b, a in zip(before, after, strict=True)
    ]
    busy = [delta(b, a, "sim:busy_seconds_total") for b, a in zip(before, after, strict=True)]
    return _row(run, hit_rate(before, after), requests, busy, modelled)


async def _switchyard(cfg: RoutingConfig, log_dir: Path) -> PolicyRow:
    async with switchyard_fleet(
        log_dir, workers=cfg.backends, delay_scale=cfg.delay_scale, edge=False
    ) as fleet:

        async def send(step: AgentStep) -> Outcome:
            req = step.generate_request(TENANT, POOL, deadline=time.time() + 300)
            return await nats_generate(fleet.bus, req, timeout=300)

        run = await run_episodes(cfg, send)
    prompt = sum(o.prompt_tokens for o in run.done)
    hit = sum(o.cached_tokens for o in run.done) / prompt if prompt else 0.0
    per_worker = Counter(o.worker for o in run.done)
    busy_by: defaultdict[str | None, float] = defaultdict(float)
    for o in run.done:
        busy_by[o.worker] += o.modelled_busy_s or 0.0
    requests = [float(per_worker.get(w, 0)) for w in fleet.workers]
    busy = [busy_by.get(w, 0.0) for w in fleet.workers]
    modelled = [o.modelled_total_s for o in run.done if o.modelled_total_s is not None]
    return _row(run, hit, requests, busy, modelled)


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
    return asyncio.run(_measure(cfg, log_dir))
