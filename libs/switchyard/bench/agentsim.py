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
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from switchyard import subjects
from switchyard.agentprompt import build_messages, fit
from switchyard.bench.fleetproc import nats_for_bench, service_processes, wait_for_workers
from switchyard.bench.phoneframes import draw_frame
from switchyard.bench.stats import percentile
from switchyard.bus.connection import Bus, connect
from switchyard.bus.provision import provision
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.bus.topology import TopologySettings, build_topology
from switchyard.config import Settings
from switchyard.engines.base import EngineRequest
from switchyard.engines.sim import SimSettings
from switchyard.engines.sim_tokens import render_prompt
from switchyard.ids import new_id
from switchyard.messages.agent import AgentStep, RawFrame, StepOptions, parse_answer
from switchyard.messages.inference import Image


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

    def tokens(self, step: AgentStep, phone: int) -> list[str]:
        first = step.step - len(step.frames) + 1
        frames = [self._image(phone, k) for k in range(first, step.step + 1)]
        req = EngineRequest(
            request_id=step.id, messages=tuple(build_messages(step, frames)), images=tuple(frames)
        )
        return render_prompt(req, self.sim)

    def _image(self, phone: int, k: int) -> Image:
        digest = hashlib.blake2b(f"{phone}:{k}".encode(), digest_size=16).hexdigest()
        w, h = self.size
        return Image(hash=digest, data=b"", mime="image/jpeg", width=w, height=h)


async def _phone(
    cfg: AgentSimConfig, bus: Bus, run: str, phone: int, model: _PrefixModel, out: list[StepRecord]
) -> None:
    history: list[str] = []
    prev: bytes | None = None
    prev_tokens: list[str] | None = None
    size = (cfg.width, cfg.height)
    for k in range(cfg.steps):
        cur = await asyncio.to_thread(draw_frame, phone, k, size)
        raw = [RawFrame(data=f, mime="image/jpeg") for f in ([prev, cur] if prev else [cur])]
        session = f"{run}-p{phone}" + (f"-s{k}" if cfg.scatter else "")
        step = AgentStep(
            tenant=cfg.tenant, session=session, frame_ts=time.time(), frames=raw,
            goal="collect the daily reward", history=history[-200:], step=k,
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
        last = frames[-1] if frames else None
        if last is not None and last.result is not None:
            res = last.result
            rec.status, rec.code = res.status, res.error.code if res.error else None
            rec.prompt_tokens, rec.cached_tokens = res.usage.prompt_tokens, res.usage.cached_tokens
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


def summarise(cfg: AgentSimConfig, recs: list[StepRecord], wall: float) -> AgentSimReport:
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
        notes=[
            "latency: wall clock on this machine, publish to action, all services sharing its CPUs",
            "shared prefix counted with the sim tokenizer (exact for --engine sim)",
        ],
    )  # fmt: skip


UNMETERED = {
    "itpm": 10**12, "otpm": 10**12, "max_concurrency": 10**6, "max_queued_tokens": 10**12,
}  # fmt: skip


@contextlib.contextmanager
def _fleet(cfg: AgentSimConfig) -> Iterator[str]:
    """The NATS URL of a fleet that serves the `agent` pool."""
    if cfg.nats_url:
        yield cfg.nats_url
        return
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(nats_for_bench(None))
        asyncio.run(_provision(url))
        # A load tool measures the fleet, not the default quotas: give its tenant room.
        policy = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "tenants.yaml"
        policy.write_text(yaml.safe_dump({"default": UNMETERED}))
        router = {
            "SY_POOLS": '["agent"]', "SY_REBALANCE_INTERVAL": "0.5", "SY_ROUTER_ID": "r0",
            "SY_TENANT_POLICY": str(policy),
        }  # fmt: skip
        stack.enter_context(service_processes("router", url, [router]))
        workers = [
            {"SY_ENGINE": cfg.engine, "SY_POOL": "agent", "SY_ASSIGNMENT": "kv",
             "SY_WORKER_ID": f"agent-w{i}", "SY_HEARTBEAT_INTERVAL": "0.5"}
            for i in range(cfg.workers)
        ]  # fmt: skip
        stack.enter_context(service_processes("worker", url, workers))
        pre = {"SY_FRAME_PROCS": "1", "SY_MAX_PIXELS": str(cfg.max_pixels)}
        stack.enter_context(service_processes("preprocessor", url, [pre]))
        asyncio.run(_wait(url, {f"agent-w{i}" for i in range(cfg.workers)}))
        yield url


async def _provision(url: str) -> None:
    bus = await connect(Settings(nats_url=url), "agent-sim-provision")
    try:
        await provision(bus.js, build_topology(TopologySettings(nats_url=url, pools=["agent"])))
    finally:
        await bus.close()


async def _wait(url: str, ids: set[str]) -> None:
    bus = await connect(Settings(nats_url=url), "agent-sim-wait")
    try:
        await wait_for_workers(bus.js, ids, timeout=180)
    finally:
        await bus.close()


async def _drive(cfg: AgentSimConfig, url: str) -> AgentSimReport:
    bus = await connect(Settings(nats_url=url), "agent-sim")
    model = _PrefixModel(cfg)
    recs: list[StepRecord] = []
    run = new_id().lower()[-10:]
    t0 = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as tg:
            for phone in range(cfg.phones):
                tg.create_task(_phone(cfg, bus, run, phone, model, recs))
    finally:
        await bus.close()
    return summarise(cfg, recs, time.perf_counter() - t0)


def run_agent_sim(cfg: AgentSimConfig) -> AgentSimReport:
    with _fleet(cfg) as url:
        return asyncio.run(_drive(cfg, url))
