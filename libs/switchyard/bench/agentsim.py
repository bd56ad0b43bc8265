"""`sy agent-sim`: cloud phones playing episodes against the fleet, straight onto NATS.

Each phone is a strict loop: draw a frame, send the step (previous + current
frame, the action history as text) on `agent.in.<tenant>`, wait for the
action on its reply inbox, validate it against the action schema, append it to
the history, go on. Without `--nats` it starts what it needs: an embedded
NATS, the router, `workers` worker processes of the chosen engine and the
preprocessor (each a subprocess, as in production).

Reuse efficiency = cached prompt tokens / tokens the step shares (as a
prefix) with its episode's previous step - what a perfect prefix cache would
serve. The shared prefix is counted with the sim engine's pseudo-tokenizer on
the same layout, with frame identities kept (frame k is the same image in
steps k and k+1), so it is exact for `--engine sim` and indicative otherwise.

Modelled step latency (`--engine sim`): the part of a step the fleet model
accounts for, free of this small machine's CPU contention:

    router queueing (admission -> dispatch to WORK, measured)
  + dispatch (dispatch -> engine start: WORK transit and the worker's pull credit, measured)
  + the sim engine's modelled queue (slot and KV), prefill and decode (virtual seconds)

The measured parts are wall seconds divided by `delay_scale` (the sim engine's
wall seconds per modelled second), so the whole figure is in modelled seconds.
What it leaves out is reported beside it, never hidden: the phone's own frame
drawing ("harness") and everything outside the router->engine span ("outside":
the preprocessor's decode/resize/hash, NATS hops to and from it, the reply).

A closed loop only offers the load of N phones if the phones are not slowed by
the harness itself: `loop_efficiency` = modelled step time / (the phones' loop
time / delay_scale). Near 1 the phones wait on the modelled fleet alone; well
below 1 the harness (this machine's CPU) throttles them and the load is lighter
than N real phones would offer - raise `delay_scale` (slow the simulated GPU's
wall clock) until it is near 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import cast

from switchyard import subjects
from switchyard.agentprompt import build_messages, fit
from switchyard.bench.phoneframes import draw_frame
from switchyard.bench.stats import percentile
from switchyard.bus.connection import Bus, connect
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.config import Settings
from switchyard.engines.base import EngineRequest
from switchyard.engines.sim import SimSettings
from switchyard.engines.sim_tokens import render_prompt
from switchyard.fleet import UNMETERED, FleetSpec, Pool, env_of, launch
from switchyard.fleet.spec import Engine
from switchyard.ids import new_id
from switchyard.messages.agent import AgentStep, RawFrame, StepOptions, parse_answer
from switchyard.messages.inference import Image, Timings

READY_TIMEOUT = 180.0  # s: llama.cpp workers load their model on a shared machine


@dataclass(frozen=True)
class AgentSimConfig:
    phones: int = 8
    steps: int = 10
    engine: str = "llamacpp"
    workers: int = 1
    width: int = 1280
    height: int = 720
    max_pixels: int = 1280 * 720  # must match the preprocessor's, for the shared-prefix count
    stale_after: float = 2.0
    max_tokens: int = 48
    tenant: str = "phones"
    nats_url: str | None = None  # a running fleet: start nothing
    scatter: bool = False  # a new partition key per step: no session affinity
    step_timeout: float = 120.0
    # Wall seconds per modelled second for the sim workers this tool starts (SY_SIM_DELAY_SCALE);
    # with --nats, say what the running fleet uses, so measured parts convert to modelled time.
    delay_scale: float = 1.0
    # Frames drawn per phone before the run (cycled); 0 = draw every frame during the run.
    frame_pool: int = 0
    frame_cache: int = 256  # the started preprocessor's prepared-frame cache (SY_FRAME_CACHE)
    stagger_s: float = 0.0  # phones start spread over this many wall seconds (no lockstep)


@dataclass
class StepRecord:
    phone: int
    step: int
    status: str
    latency_s: float
    prompt_tokens: int = 0
    cached_tokens: int = 0
    shared_tokens: int = 0
    valid: bool = False
    code: str | None = None
    frame_s: float = 0.0  # the phone drew this frame (harness CPU; 0 with a frame pool)
    fleet_s: float | None = None  # admission -> answer (the worker's timings.total, wall)
    router_s: float | None = None  # admission -> dispatch (wall)
    dispatch_s: float | None = None  # dispatch -> engine start (wall)
    engine_queue_s: float | None = None  # modelled
    prefill_s: float | None = None  # modelled
    decode_s: float | None = None  # modelled

    def modelled(self, scale: float) -> float | None:
        """Modelled step latency in modelled seconds; None without the engine's model."""
        if self.status != "ok" or self.prefill_s is None:
            return None
        measured = ((self.router_s or 0.0) + (self.dispatch_s or 0.0)) / (scale or 1.0)
        return measured + (self.engine_queue_s or 0.0) + self.prefill_s + (self.decode_s or 0.0)

    def parts(self, scale: float) -> dict[str, float]:
        """The modelled latency's components, in modelled seconds."""
        k = scale or 1.0
        return {
            "router": (self.router_s or 0.0) / k, "dispatch": (self.dispatch_s or 0.0) / k,
            "engine_queue": self.engine_queue_s or 0.0, "prefill": self.prefill_s or 0.0,
            "decode": self.decode_s or 0.0,
        }  # fmt: skip


@dataclass
class ModelledLatency:
    """The fleet-model part of the steps' latency (see the module docstring), in ms."""

    delay_scale: float
    steps: int  # steps the figure covers (all steps sent)
    p50_ms: float
    p99_ms: float  # a step not answered ok counts as infinitely late (inf)
    p50_parts_ms: dict[str, float]  # median of each component
    tail_parts_ms: dict[str, float]  # mean of each component over the steps at or above p99
    limit: str  # the largest tail component group: queueing, prefill or decode
    loop_efficiency: float
    harness_frame_p50_ms: float  # the phone drawing a frame (wall)
    outside_p50_ms: float  # wall - admission->answer: preprocess CPU, NATS hops, reply (wall)
    outside_p99_ms: float


@dataclass
class AgentSimReport:
    config: AgentSimConfig
    steps: int
    ok: int
    stale: int
    errors: dict[str, int]
    invalid_actions: int
    latency_p50_ms: float
    latency_p99_ms: float
    prefix_hit_rate: float  # steps after the first: cached / prompt tokens
    prefix_hit_rate_first_step: float
    reuse_efficiency: float  # steps after the first: cached / shared-with-previous tokens
    actions_per_s: float
    wall_s: float
    notes: list[str] = field(default_factory=list)
    modelled: ModelledLatency | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class _PrefixModel:
    """The sim tokenizer's view of a phone's prompts, to count the shared prefix."""

    def __init__(self, cfg: AgentSimConfig) -> None:
        self.size = fit(cfg.width, cfg.height, cfg.max_pixels)
        self.sim = SimSettings()
        self.pool = cfg.frame_pool

    def tokens(self, step: AgentStep, phone: int) -> list[str]:
        first = step.step - len(step.frames) + 1
        frames = [self._image(phone, k) for k in range(first, step.step + 1)]
        req = EngineRequest(
            request_id=step.id, messages=tuple(build_messages(step, frames)), images=tuple(frames)
        )
        return render_prompt(req, self.sim)

    def _image(self, phone: int, k: int) -> Image:
        # With a frame pool, step k shows pool frame k % pool: the same image, the same hash.
        ident = k % self.pool if self.pool else k
        digest = hashlib.blake2b(f"{phone}:{ident}".encode(), digest_size=16).hexdigest()
        w, h = self.size
        return Image(hash=digest, data=b"", mime="image/jpeg", width=w, height=h)


@dataclass
class _Loop:
    """One phone's loop span (wall, perf_counter), for the loop efficiency."""

    start: float = 0.0
    end: float = 0.0


# Drawn once per process: a capacity search runs many loads with the same phones.
_pool_frame = functools.lru_cache(maxsize=None)(draw_frame)


def frame_pool(cfg: AgentSimConfig, phone: int) -> list[bytes]:
    return [_pool_frame(phone, j, (cfg.width, cfg.height)) for j in range(cfg.frame_pool)]


async def _phone(
    cfg: AgentSimConfig, bus: Bus, run: str, phone: int, model: _PrefixModel,
    out: list[StepRecord], pool: list[bytes], loop: _Loop,
) -> None:  # fmt: skip
    history: list[str] = []
    prev: bytes | None = None
    prev_tokens: list[str] | None = None
    size = (cfg.width, cfg.height)
    if cfg.stagger_s > 0:  # real phones are not in lockstep: spread the first steps
        await asyncio.sleep(cfg.stagger_s * phone / cfg.phones)
    loop.start = time.perf_counter()
    for k in range(cfg.steps):
        t_frame = time.perf_counter()
        cur = pool[k % len(pool)] if pool else await asyncio.to_thread(draw_frame, phone, k, size)
        frame_s = time.perf_counter() - t_frame
        raw = [RawFrame(data=f, mime="image/jpeg") for f in ([prev, cur] if prev else [cur])]
        session = f"{run}-p{phone}" + (f"-s{k}" if cfg.scatter else "")
        step = AgentStep(
            tenant=cfg.tenant, session=session, frame_ts=time.time(), frames=raw,
            # The episode in the goal: another run (or load of a search) on the same fleet
            # draws the same frames and actions, and must not find its prompts cached.
            goal=f"collect the daily reward (episode {run}-p{phone})", history=history[-200:],
            step=k,
            stale_after=cfg.stale_after, options=StepOptions(max_tokens=cfg.max_tokens),
        )  # fmt: skip
        tokens = model.tokens(step, phone)
        shared = _common_prefix(prev_tokens, tokens) if prev_tokens is not None else 0
        t0 = time.perf_counter()
        async with TokenStreamReader(bus.nc, idle_timeout=cfg.step_timeout) as reader:
            sent = step.model_copy(update={"reply": reader.inbox})
            await publish(bus.js, subjects.agent_in(cfg.tenant), sent, msg_id=step.id)
            frames = [f async for f in reader]
        rec = StepRecord(phone, k, "lost", time.perf_counter() - t0, shared_tokens=shared)
        rec.frame_s = frame_s
        last = frames[-1] if frames else None
        if last is not None and last.result is not None:
            res = last.result
            rec.status, rec.code = res.status, res.error.code if res.error else None
            rec.prompt_tokens, rec.cached_tokens = res.usage.prompt_tokens, res.usage.cached_tokens
            _timings_into(rec, res.timings)
        elif last is not None and last.error is not None:
            rec.status, rec.code = "rejected", last.error.code
        action = "(no action)"
        if rec.status == "ok" and last is not None and last.result is not None:
            with contextlib.suppress(ValueError):
                actions = parse_answer(last.result.text)
                rec.valid = True
                action = json.dumps(actions[0].model_dump(), separators=(",", ":"))
        out.append(rec)
        history.append(action)
        prev, prev_tokens = cur, tokens
    loop.end = time.perf_counter()


def _timings_into(rec: StepRecord, t: Timings) -> None:
    rec.fleet_s = t.total
    if t.router is not None:
        rec.router_s = t.router
        rec.dispatch_s = max(0.0, t.queue - t.router)
    if t.modelled is not None:
        m = t.modelled
        rec.engine_queue_s, rec.prefill_s, rec.decode_s = m.queue, m.prefill, m.decode


def _ms(x: float) -> float:
    return round(x * 1000, 1) if math.isfinite(x) else math.inf


def modelled_latency(
    recs: Sequence[StepRecord], scale: float, loop_s: float
) -> ModelledLatency | None:
    """The modelled-latency summary of a run, or None if no step carried the engine's model.

    `loop_s` is the phones' summed loop time (wall); steps not answered ok count
    as infinitely late, so p99 <= target means 99 % were served ok within it.
    """
    modelled = [(r, r.modelled(scale)) for r in recs]
    ok = [(r, m) for r, m in modelled if m is not None]
    if not ok:
        return None
    values = [m if m is not None else math.inf for _, m in modelled]
    p99 = percentile(values, 0.99)
    tail = [r for r, m in ok if m >= p99] or [max(ok, key=lambda rm: rm[1])[0]]
    names = ("router", "dispatch", "engine_queue", "prefill", "decode")
    parts = [r.parts(scale) for r, _ in ok]
    tails = [r.parts(scale) for r in tail]
    tail_mean = {n: sum(p[n] for p in tails) / len(tails) for n in names}
    groups = {
        "queueing": tail_mean["router"] + tail_mean["dispatch"] + tail_mean["engine_queue"],
        "prefill": tail_mean["prefill"],
        "decode": tail_mean["decode"],
    }
    outside = [r.latency_s - r.fleet_s for r in recs if r.status == "ok" and r.fleet_s is not None]
    modelled_sum = sum(m for _, m in ok)
    return ModelledLatency(
        delay_scale=scale, steps=len(recs),
        p50_ms=_ms(percentile(values, 0.5)), p99_ms=_ms(p99),
        p50_parts_ms={n: _ms(percentile([p[n] for p in parts], 0.5)) for n in names},
        tail_parts_ms={n: _ms(v) for n, v in tail_mean.items()},
        limit=max(groups, key=lambda g: groups[g]),
        loop_efficiency=round(modelled_sum / (loop_s / (scale or 1.0)), 3) if loop_s else 0.0,
        harness_frame_p50_ms=_ms(percentile([r.frame_s for r in recs], 0.5)),
        outside_p50_ms=_ms(percentile(outside, 0.5)), outside_p99_ms=_ms(percentile(outside, 0.99)),
    )  # fmt: skip


def summarise(
    cfg: AgentSimConfig, recs: list[StepRecord], wall: float, loop_s: float = 0.0
) -> AgentSimReport:
    ok = [r for r in recs if r.status == "ok"]
    later = [r for r in ok if r.step > 0]
    first = [r for r in ok if r.step == 0]
    errors: dict[str, int] = {}
    for r in recs:
        if r.status not in ("ok", "stale"):
            key = f"{r.status}:{r.code}"
            errors[key] = errors.get(key, 0) + 1

    cached = sum(r.cached_tokens for r in later)

    def ratio(num: int, den: int) -> float:
        return round(num / den, 4) if den else 0.0

    modelled = modelled_latency(recs, cfg.delay_scale, loop_s)
    notes = [
        "latency: wall clock on this machine, publish to action, all services sharing its CPUs",
        "shared prefix counted with the sim tokenizer (exact for --engine sim)",
    ]
    if modelled is not None:
        notes.append(
            "modelled: router + dispatch (measured, wall / delay_scale) + the sim engine's "
            "modelled queue, prefill and decode; harness frame drawing and everything outside "
            "admission->answer (preprocessing, NATS hops) reported apart, in wall ms"
        )
    return AgentSimReport(
        config=cfg,
        steps=len(recs),
        ok=len(ok),
        stale=sum(r.status == "stale" for r in recs),
        errors=errors,
        invalid_actions=sum(not r.valid for r in ok),
        latency_p50_ms=round(percentile([r.latency_s for r in ok], 0.5) * 1000, 1),
        latency_p99_ms=round(percentile([r.latency_s for r in ok], 0.99) * 1000, 1),
        prefix_hit_rate=ratio(cached, sum(r.prompt_tokens for r in later)),
        prefix_hit_rate_first_step=ratio(
            sum(r.cached_tokens for r in first), sum(r.prompt_tokens for r in first)
        ),
        reuse_efficiency=ratio(cached, sum(r.shared_tokens for r in later)),
        actions_per_s=round(len(ok) / wall, 2) if wall else 0.0,
        wall_s=round(wall, 2),
        notes=notes,
        modelled=modelled,
    )  # fmt: skip


@contextlib.contextmanager
def agent_fleet(cfg: AgentSimConfig) -> Iterator[str]:
    """The NATS URL of a fleet that serves the `agent` pool, once it is ready."""
    if cfg.nats_url:
        yield cfg.nats_url
        return
    sim = env_of(sim_delay_scale=cfg.delay_scale) if cfg.engine == "sim" else {}
    spec = FleetSpec(
        pools=(Pool("agent", cfg.workers, sim),), engine=cast(Engine, cfg.engine),
        # A load tool measures the fleet, not the default quotas: give its tenant room.
        tenant_policy=UNMETERED,
        service_env={"preprocessor": env_of(frame_procs=1, max_pixels=cfg.max_pixels,
                                            frame_cache=cfg.frame_cache)},
    )  # fmt: skip
    with launch(spec, ready_timeout=READY_TIMEOUT) as fleet:
        yield fleet.nats_url


async def _drive(cfg: AgentSimConfig, url: str) -> AgentSimReport:
    pools = [frame_pool(cfg, p) for p in range(cfg.phones)] if cfg.frame_pool else []
    bus = await connect(Settings(nats_url=url), "agent-sim")
    model = _PrefixModel(cfg)
    recs: list[StepRecord] = []
    loops = [_Loop() for _ in range(cfg.phones)]
    run = new_id().lower()[-10:]
    t0 = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as tg:
            for phone in range(cfg.phones):
                pool = pools[phone] if pools else []
                tg.create_task(_phone(cfg, bus, run, phone, model, recs, pool, loops[phone]))
    finally:
        await bus.close()
    loop_s = sum(lp.end - lp.start for lp in loops)
    return summarise(cfg, recs, time.perf_counter() - t0, loop_s)


def run_agent_sim(cfg: AgentSimConfig) -> AgentSimReport:
    with agent_fleet(cfg) as url:
        return asyncio.run(_drive(cfg, url))


# ---------------------------------------------------------------------------
# Capacity search: the largest phone count whose modelled p99 meets the target.


@dataclass
class LoadResult:
    phones: int
    steps: int
    ok: int
    stale: int
    errors: dict[str, int]
    invalid_actions: int
    wall_p50_ms: float
    wall_p99_ms: float
    modelled: ModelledLatency | None
    passed: bool
    reason: str


@dataclass
class CapacityReport:
    target_p99_ms: float
    capacity: int | None  # the largest passing load; None if the first load failed
    at_capacity: LoadResult | None
    first_failure: LoadResult | None
    limit: str  # what limits it, in words
    loads: list[LoadResult]  # in the order run
    config: AgentSimConfig
    wall_s: float
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def next_load(results: dict[int, bool], ladder: Sequence[int], resolution: int) -> int | None:
    """The next phone count to try, or None when the search is done.

    Climb `ladder` until a load fails, then bisect between the largest passing
    and the smallest failing load until they are `resolution` apart or less.
    A load below the first rung that fails ends the search (capacity below it).
    """
    for n in ladder:
        if n not in results:
            return n
        if not results[n]:
            break
    passing = [n for n, ok in results.items() if ok]
    failing = [n for n, ok in results.items() if not ok]
    if not failing:
        return None  # every rung passed: capacity is at least the top rung
    hi = min(failing)
    lo = max((n for n in passing if n < hi), default=0)
    if lo == 0 or hi - lo <= resolution:
        return None
    mid = (lo + hi) // 2
    return mid if mid not in results else None


def judge(report: AgentSimReport, target_ms: float, min_loop_efficiency: float) -> LoadResult:
    m = report.modelled
    if m is None:
        passed, reason = False, "no modelled timings (not a sim fleet?)"
    elif m.loop_efficiency < min_loop_efficiency:
        passed = False
        reason = (
            f"harness-bound: loop efficiency {m.loop_efficiency} < {min_loop_efficiency}, the "
            "phones could not offer this load on this machine (raise --delay-scale)"
        )
    elif m.p99_ms > target_ms:
        late = "not all steps ok" if math.isinf(m.p99_ms) else f"{m.p99_ms} ms"
        passed, reason = False, f"modelled p99 {late} > {target_ms} ms (limit: {m.limit})"
    else:
        passed, reason = True, f"modelled p99 {m.p99_ms} ms <= {target_ms} ms"
    return LoadResult(
        phones=report.config.phones, steps=report.steps, ok=report.ok, stale=report.stale,
        errors=report.errors, invalid_actions=report.invalid_actions,
        wall_p50_ms=report.latency_p50_ms, wall_p99_ms=report.latency_p99_ms,
        modelled=m, passed=passed, reason=reason,
    )  # fmt: skip


def explain_limit(at: LoadResult | None, fail: LoadResult | None) -> str:
    """What limits capacity, from the p99 tails of the largest passing and first failing load.

    Names the largest component group of the failing tail, and the component that
    grew most between the two loads: a budget mostly spent on a fixed prefill and
    decode can be tipped over by a little queueing, and both are worth knowing.
    """
    src = fail or at
    if src is None or src.modelled is None:
        return "unknown (no modelled timings)"
    if fail is not None and fail.reason.startswith("harness-bound"):
        return f"this machine: {fail.reason}"
    t = src.modelled.tail_parts_ms
    queue = t["router"] + t["dispatch"] + t["engine_queue"]
    where = "beyond capacity" if src is fail else "at the largest load tried"
    text = (
        f"{src.modelled.limit} ({where}, {src.phones} phones, mean of the p99 tail: decode "
        f"{t['decode']} ms, prefill {t['prefill']} ms, queueing {round(queue, 1)} ms = router "
        f"{t['router']} + dispatch {t['dispatch']} + engine queue {t['engine_queue']})"
    )
    if fail is not None and fail.modelled is not None and at is not None and at.modelled:
        before = at.modelled.tail_parts_ms
        growth = {k: t[k] - before[k] for k in t if math.isfinite(t[k] - before[k])}
        if growth:
            grew = max(growth, key=lambda k: growth[k])
            text += (
                f"; from {at.phones} to {fail.phones} phones the tail grew most in {grew} "
                f"(+{round(growth[grew], 1)} ms)"
            )
    return text


def capacity_search(
    measure: Callable[[int], LoadResult], ladder: Sequence[int], resolution: int
) -> list[LoadResult]:
    results: dict[int, bool] = {}
    out: list[LoadResult] = []
    while (n := next_load(results, ladder, resolution)) is not None:
        res = measure(n)
        results[n] = res.passed
        out.append(res)
    return out


def run_capacity_search(
    cfg: AgentSimConfig, ladder: Sequence[int], target_ms: float = 500.0,
    resolution: int = 25, min_loop_efficiency: float = 0.8,
) -> CapacityReport:  # fmt: skip
    """Start one fleet (or use `cfg.nats_url`) and search it; see `next_load`."""
    t0 = time.perf_counter()
    # Every phone's pool frames, and the previous one, stay prepared across a load.
    sized = replace(cfg, frame_cache=max(cfg.frame_cache, max(ladder) * (cfg.frame_pool + 1)))
    with agent_fleet(sized) as url:
        # Not measured: lets partition assignment settle and the services warm up, so the
        # first rung does not pay the fleet's start-up.
        asyncio.run(_drive(replace(sized, phones=min(ladder), steps=2), url))

        def measure(n: int) -> LoadResult:
            res = judge(asyncio.run(_drive(replace(sized, phones=n), url)), target_ms,
                        min_loop_efficiency)  # fmt: skip
            # A search takes minutes: say where it is (stderr, so --json stays clean).
            print(f"agent-sim search: {n} phones: {res.reason}", file=sys.stderr, flush=True)
            return res

        loads = capacity_search(measure, ladder, resolution)
    passing = [r for r in loads if r.passed]
    at = max(passing, key=lambda r: r.phones) if passing else None
    above = [r for r in loads if not r.passed and (at is None or r.phones > at.phones)]
    fail = min(above, key=lambda r: r.phones) if above else None
    return CapacityReport(
        target_p99_ms=target_ms, capacity=at.phones if at else None, at_capacity=at,
        first_failure=fail, limit=explain_limit(at, fail), loads=loads, config=sized,
        wall_s=round(time.perf_counter() - t0, 1),
        notes=[
            "pass: modelled p99 <= target with every step answered ok (a step not ok counts "
            f"as infinitely late) and loop efficiency >= {min_loop_efficiency}",
            "modelled = router + dispatch (measured wall / delay_scale) + the sim engine's "
            "modelled queue, prefill, decode; wall figures include this machine's CPU work",
            f"resolution: bisection stops when pass and fail are <= {resolution} phones apart",
            f"a 2-step warm-up with {min(ladder)} phones ran first and is not reported",
        ],
    )  # fmt: skip
