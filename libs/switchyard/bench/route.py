"""`sy bench route`: the router's placement policies, measured on the router that ships.

What runs: for each policy a fresh fleet (`switchyard.fleet.launch(spec, mode="inproc")`,
the same service code `sy up` runs, as tasks on this process's loop): the real router
with `SY_ROUTING_POLICY=<policy>` and `workers` real workers, each with its own `sim`
engine (identical settings and seed), on a NATS of its own (an embedded server per
policy, or `--nats URL` with a private pool per policy). Requests are published straight
onto `req.<workload>.<tenant>`, as the preprocessor would, under an unmetered tenant
policy, so admission never refuses and placement alone differs between policies. The
workloads (`switchyard.bench.routeload`): `agent` (closed-loop episodes, each step
carrying its `session`) and `chat` (tenants with their own system prompts, skewed
traffic, conversations and one-shot requests, no session). The policies:
`round_robin`, `least_loaded` and `switchyard` (the shipped default).

How it is measured. Everything is read from the results the workers publish:

- `prefix_hit_rate`: cached / prompt tokens of every request (`usage`), as the sim's
  prefix cache (chained 16-token block hashes, cache salt, LRU) reported them;
- latencies are the sim's *modelled* time (`timings.modelled`: virtual seconds at its
  GPU calibration, `calibration` in the JSON, `SY_SIM_GPU` picks it), not wall clock:
  `step`/`request` = modelled total (queue for a batch slot and KV + prefill +
  decode); TTFT = the sim's modelled arrival -> first token;
- `load_imbalance`: max / mean over workers of modelled GPU busy time (each request's
  share of the engine steps it ran in, `ModelledTimings.gpu`: what the GPU spent, not
  the time requests waited behind each other), `worker_requests` the count per worker;
- `stickiness`: the mean, over episodes (agent) or conversations (chat), of the share
  of its requests that ran on its most-used worker; for chat also how many workers each
  tenant's requests reached, and the busiest tenant's;
- `duplicates`: results seen on `res.>` beyond one per request (a re-execution);
- `wall_s` only says how long the run took here (not a result).

The wall clock follows the modelled one times `delay_scale`; on a loaded CPU the sims
drift rather than burst (`SimEngine._sleep_until`), so the modelled latencies do not
include this machine's contention, but a CPU that cannot keep up spreads the arrivals
in modelled time (fewer requests in flight than the workload would have on GPUs). The
box manages ~170 agent steps/s (fleet, client and sims share one event loop). The agent
phones act `act_s` (8 s, drawn 4-12 s) between steps, ~23 modelled steps/s in all, so
`--delay-scale 0.25` keeps up and runs the three policies in ~4.5 minutes (at 1.0 they
take ~9); the chat lanes send back to back and need 1.0 (~3 minutes). Requests are sent with
`stream=False` (the end frame only), so the CPU goes to routing and serving rather
than to per-token frames; placement does not depend on it.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from switchyard import eventloop, subjects
from switchyard.bench.peers.clients import Outcome, nats_generate
from switchyard.bench.peers.stats import imbalance
from switchyard.bench.routeload import (
    AGENT_ACT_S,
    FRAME,
    MAX_TOKENS,
    SYSTEM_PROMPT,
    BenchRequest,
    ChatConfig,
    Run,
    WorkloadName,
    run_agent,
    run_chat,
)
from switchyard.bench.stats import percentile
from switchyard.bus.connection import Bus, connect
from switchyard.bus.topology import ASSIGNMENTS_BUCKET
from switchyard.codec import decode
from switchyard.engines.sim import pseudo_tokens
from switchyard.errors import DecodeError
from switchyard.fleet import UNMETERED, FleetSpec, Pool, env_of, launch
from switchyard.messages.inference import GenerateResult
from switchyard.scheduling.affinity import POLICIES, Policy

POOL = "route"
REQUEST_TIMEOUT = 300.0  # s without a frame before a request counts as failed


@dataclass(frozen=True)
class RouteConfig:
    workload: WorkloadName = "agent"
    workers: int = 8
    delay_scale: float = 1.0
    seed: int = 0
    sessions: int = 200  # agent: episodes, all at once
    steps: int = 20  # agent: steps per episode
    act_s: float = AGENT_ACT_S  # agent: modelled seconds a phone acts between steps
    chat: ChatConfig = field(default_factory=ChatConfig)
    partitions: int = 64
    policies: tuple[Policy, ...] = POLICIES
    nats_url: str | None = None  # None: an embedded server per policy

    @property
    def requests(self) -> int:
        return self.sessions * self.steps if self.workload == "agent" else self.chat.requests


@dataclass(frozen=True)
class PolicyResult:
    requests: int  # completed
    failed: int
    first_error: str | None
    duplicates: int  # results beyond one per request seen on res.>
    prefix_hit_rate: float  # cached / prompt tokens, all requests
    prefix_hit_rate_after_first: float  # requests after the first of their thread
    ttft_p50_ms: float
    ttft_p99_ms: float
    request_p50_ms: float  # arrival at the engine -> last token (a step, for the agent)
    request_p99_ms: float
    load_imbalance: float  # max / mean of per-worker modelled busy time
    stickiness: float  # mean share of a thread's requests on its most-used worker
    worker_requests: list[int]
    worker_busy_s: list[float]  # modelled GPU time per worker (`ModelledTimings.gpu`)
    tenant_workers: dict[str, int]  # chat: workers each tenant's requests reached
    tenant_requests: dict[str, int]
    busiest_tenant: str | None
    busiest_tenant_share: float  # of all completed requests
    busiest_tenant_workers: int
    wall_s: float  # how long this policy's run took on this machine (not a result)
    # The sim GPU preset(s) the modelled figures are at (`ModelledTimings.calibration`).
    calibration: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RouteBench:
    config: RouteConfig
    results: dict[str, PolicyResult]

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {name: asdict(r) for name, r in self.results.items()}
        c = self.config
        config: dict[str, object] = {
            "workload": c.workload, "workers": c.workers, "delay_scale": c.delay_scale,
            "seed": c.seed, "partitions": c.partitions, "policies": list(self.results),
            "requests": c.requests,
            "latency": "modelled by the sim engine (virtual seconds), not wall clock",
            "ttft": "modelled arrival -> first token",
        }  # fmt: skip
        if c.workload == "agent":
            config |= {
                "sessions": c.sessions, "steps": c.steps, "act_s": c.act_s,
                "frame": f"{FRAME[0]}x{FRAME[1]}",
                "max_tokens": MAX_TOKENS,
                "system_prompt_tokens": len(pseudo_tokens(SYSTEM_PROMPT)),
            }  # fmt: skip
        else:
            config |= {"chat": asdict(c.chat),
                       "tenant_shares": [round(s, 4) for s in c.chat.shares()]}  # fmt: skip
        out["config"] = config
        return out


def summarise(run: Run, workers: list[str], duplicates: int) -> PolicyResult:
    """The numbers of one policy's run (see the module docstring for each)."""
    done = run.done
    modelled = [o.modelled for _, o in done if o.modelled is not None]
    requests, busy = run.per_worker(workers)
    threads: defaultdict[str, list[str | None]] = defaultdict(list)
    tenants: defaultdict[str, set[str | None]] = defaultdict(set)
    for r, o in done:
        threads[r.thread].append(o.worker)
        tenants[r.tenant].add(o.worker)
    sticky = [max(Counter(ws).values()) / len(ws) for ws in threads.values() if len(ws) > 1]
    tenant_requests = Counter(r.tenant for r, _ in done)
    busiest = max(tenant_requests, key=lambda t: (tenant_requests[t], t), default=None)
    ttft = [m.ttft for m in modelled if m.ttft is not None]
    total = [m.total for m in modelled]
    errors = run.errors
    return PolicyResult(
        requests=len(done), failed=len(errors), first_error=errors[0] if errors else None,
        duplicates=duplicates,
        prefix_hit_rate=round(run.prefix_hit_rate(), 4),
        prefix_hit_rate_after_first=round(run.prefix_hit_rate(after_first=True), 4),
        ttft_p50_ms=_ms(percentile(ttft, 0.5)), ttft_p99_ms=_ms(percentile(ttft, 0.99)),
        request_p50_ms=_ms(percentile(total, 0.5)), request_p99_ms=_ms(percentile(total, 0.99)),
        load_imbalance=round(imbalance(busy), 3),
        stickiness=round(statistics.fmean(sticky), 4) if sticky else 0.0,
        worker_requests=requests,
        worker_busy_s=[round(b, 3) for b in busy],
        tenant_workers={t: len(ws) for t, ws in sorted(tenants.items())},
        tenant_requests=dict(sorted(tenant_requests.items())),
        busiest_tenant=busiest,
        busiest_tenant_share=round(tenant_requests[busiest] / len(done), 4) if busiest else 0.0,
        busiest_tenant_workers=len(tenants[busiest]) if busiest else 0,
        wall_s=round(run.wall_s, 2),
        calibration=sorted({m.calibration or "unlabelled" for m in modelled}),
    )  # fmt: skip


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


class _ResultCounter:
    """Counts the results published on `res.>` per request id: more than one is a
    request that ran twice (each run publishes its result, deduplicated or not)."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    async def on_result(self, msg: Msg) -> None:
        with contextlib.suppress(DecodeError):
            self.seen[decode(msg.data, GenerateResult).request_id] += 1

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.seen.values() if n > 1)


async def _forget_pool(js: JetStreamContext, pool: str, partitions: int) -> None:
    """On a shared NATS: delete the private pool's WORK consumers and assignments."""
    for p in range(partitions):
        with contextlib.suppress(Exception):  # already gone is fine
            await js.delete_consumer("WORK", subjects.work_consumer(pool, p))
    kv = await js.key_value(ASSIGNMENTS_BUCKET)
    for p in range(partitions):
        with contextlib.suppress(Exception):
            await kv.purge(f"{pool}.p{p}")


@contextlib.asynccontextmanager
async def _fleet(cfg: RouteConfig, policy: Policy, pool: str) -> AsyncIterator[Bus]:
    """A fresh in-process fleet whose router runs `policy`; a client connection to it."""
    sim = env_of(sim_delay_scale=cfg.delay_scale, sim_seed=cfg.seed)
    spec = FleetSpec(
        pools=(Pool(pool, cfg.workers, sim),), engine="sim", partitions=cfg.partitions,
        services=("router",), tenant_policy=UNMETERED, env=env_of(log_level="warning"),
        service_env={"router": env_of(routing_policy=policy)},
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="sy-bench-route-") as workdir:
        async with launch(spec, mode="inproc", nats_url=cfg.nats_url, log_dir=Path(workdir)) as f:
            bus = await connect(f.client, "sy-bench-route")
            try:
                yield bus
            finally:
                if cfg.nats_url is not None:
                    await _forget_pool(bus.js, pool, cfg.partitions)
                await bus.close()


async def run_policy(cfg: RouteConfig, policy: Policy) -> PolicyResult:
    # A private pool on a shared NATS: no heartbeat or assignment of an earlier fleet
    # (they outlive it by their TTL) can be mistaken for one of this fleet's workers.
    pool = POOL if cfg.nats_url is None else f"route-{uuid.uuid4().hex[:10]}"
    async with _fleet(cfg, policy, pool) as bus:
        counter = _ResultCounter()
        sub = await bus.nc.subscribe(subjects.RES_ALL, cb=counter.on_result)

        async def send(request: BenchRequest) -> Outcome:
            deadline = time.time() + REQUEST_TIMEOUT
            req = request.generate_request(pool, deadline, stream=False)
            return await nats_generate(bus, req, timeout=REQUEST_TIMEOUT)

        try:
            run = await _drive(cfg, send)
            await bus.nc.flush()  # every result published so far has reached the counter
        finally:
            await sub.unsubscribe()
    workers = list(Pool(pool, cfg.workers).worker_ids())
    return summarise(run, workers, counter.duplicates)


def _drive(cfg: RouteConfig, send: Callable[[BenchRequest], Awaitable[Outcome]]) -> Awaitable[Run]:
    if cfg.workload == "agent":
        return run_agent(cfg.sessions, cfg.steps, cfg.seed, send, cfg.act_s, cfg.delay_scale)
    return run_chat(cfg.chat, send)


def run_route_bench(cfg: RouteConfig) -> RouteBench:
    """Every policy, one after the other (so they do not share the CPU)."""
    unknown = set(cfg.policies) - set(POLICIES)
    if unknown:
        raise ValueError(f"unknown policies {sorted(unknown)}; choose from {list(POLICIES)}")

    async def run_all() -> dict[str, PolicyResult]:
        return {policy: await run_policy(cfg, policy) for policy in cfg.policies}

    return RouteBench(cfg, eventloop.run(run_all()))
