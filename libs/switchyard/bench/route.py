"""`sy bench route`: placement policies compared on one simulated agent workload.

In process and without NATS: the question is only *which worker* each request
goes to, and a 2-core box cannot run 8 worker processes and a router at this
load. Each policy drives its own fresh set of `SimEngine`s (same settings, same
seed) with the same closed-loop agent episodes. Every latency is the engines'
modelled time (`SimTimings`, virtual seconds of the A100 calibration), so the
numbers do not depend on wall-clock noise or on `delay_scale`, which only sets
how fast the run goes.

The workload: `sessions` episodes of `steps` steps, all running at once; an
episode sends step k+1 as soon as step k's action is complete. Step k's prompt is

    system prompt (shared) | action history | frame k-1 | frame k | query

with 1280x720 frames whose content hash is fixed per (seed, session, step), so
step k's current frame is step k+1's previous frame, and an Action-schema
constrained answer that is appended to the history.

What a warm worker can serve from its prefix cache is the system prompt and the
history up to the previous step: caching is positional (chained block hashes,
as in vLLM), and frame k follows a history one action longer in step k+1 than
in step k, so the previous frame is computed again whatever the policy.

Reading the numbers: the sim prefills admitted requests side by side, so a
worker with more sessions is not slower until it runs out of batch slots or KV
cache; latency and throughput show the cache, `load_imbalance` shows the load
that a real GPU would turn into queueing.

The policies: `round_robin` (the next worker for every request), `least_loaded`
(fewest outstanding requests) and `affinity` (session -> partition -> worker by
`Placement`, the router's bounded-load consistent hashing).

Throughput is steps per modelled second of the longest episode: episodes start
together and send their next step without think time, so an episode lasts the
sum of its steps' modelled latencies and the run lasts as long as the longest.
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from typing import Literal

from pydantic import RootModel

from switchyard.bench.stats import percentile
from switchyard.engines.base import EngineError, EngineRequest
from switchyard.engines.sim import SimEngine, SimSettings, SimTimings, pseudo_tokens
from switchyard.messages.agent import Action
from switchyard.messages.inference import (
    ChatMessage,
    Image,
    ImagePart,
    JsonSchemaConstraint,
    Sampling,
    TextPart,
)
from switchyard.partition import partition
from switchyard.scheduling.placement import Placement, WorkerView

Policy = Literal["round_robin", "least_loaded", "affinity"]
POLICIES: tuple[Policy, ...] = ("round_robin", "least_loaded", "affinity")

PARTITIONS = 64
EPSILON = 0.25
FRAME = (1280, 720)  # a phone screen in landscape: 1,176 visual tokens in the sim
MAX_TOKENS = 48  # the agent default (StepOptions); Action answers are ~20 tokens

SYSTEM_PROMPT = (
    "You are an agent that plays a mobile game on a cloud phone. Every step you "
    "receive the previous screenshot, the current screenshot and the actions you "
    "have taken so far in this episode. Compare the two screenshots to see what "
    "your last action changed, then answer with exactly one next action as a JSON "
    "object and nothing else. Actions: click at x, y in screen pixels; long_press "
    "at x, y for ms milliseconds; swipe from x1, y1 to x2, y2 over ms milliseconds; "
    "type a short text into the focused field; back to press the system back "
    "button; wait for ms milliseconds when the screen is loading or animating; "
    "done when the goal of the episode is reached. Rules: never tap ads or "
    "purchase buttons; close pop-ups with their close button or back; if the same "
    "action failed twice, try a different one; prefer waiting over tapping while a "
    "spinner is visible; keep coordinates inside the screen; answer quickly. The "
    "screen is 1280 pixels wide and 720 pixels high, with the origin at the top "
    "left corner. Dialogs usually have their confirm button at the bottom right "
    "and their close button at the top right. When a tutorial hand points at a "
    "button, click that button. When the goal needs text, click the field first, "
    "then type. Do not explain your answer."
)


class _ActionAnswer(RootModel[Action]):
    """One action: the JSON schema an agent step constrains its answer to."""


_ACTION_SCHEMA = _ActionAnswer.model_json_schema()


@dataclass(frozen=True)
class RouteConfig:
    sessions: int = 200
    steps: int = 20
    workers: int = 8
    delay_scale: float = 0.1
    seed: int = 0


@dataclass(frozen=True)
class PolicyResult:
    steps: int  # completed
    failed: int
    prefix_hit_rate: float  # cached / prompt tokens, all steps
    prefix_hit_rate_after_first: float  # steps 2.. of each episode
    ttft_p50_ms: float
    ttft_p99_ms: float
    step_p50_ms: float  # arrival -> last token
    step_p99_ms: float
    load_imbalance: float  # max / mean of per-worker busy time
    throughput_steps_per_s: float  # per modelled second (see the module docstring)
    makespan_s: float  # the longest episode, modelled
    stickiness: float  # mean share of an episode's steps on its most-used worker
    worker_busy_s: list[float]  # modelled service time (prefill + decode) per worker
    wall_s: float  # how long the run took on this machine (not a result)


@dataclass(frozen=True)
class RouteBench:
    config: RouteConfig
    results: dict[str, PolicyResult]

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {name: asdict(r) for name, r in self.results.items()}
        out["config"] = {
            **asdict(self.config),
            "policies": list(self.results),
            "partitions": PARTITIONS,
            "epsilon": EPSILON,
            "frame": f"{FRAME[0]}x{FRAME[1]}",
            "max_tokens": MAX_TOKENS,
            "system_prompt_tokens": len(pseudo_tokens(SYSTEM_PROMPT)),
            "latency": "modelled by the sim engine (virtual seconds), not wall clock",
        }
        return out


class _Router:
    """Picks a worker per request and counts each worker's outstanding requests."""

    def __init__(self, policy: Policy, workers: int, slots: int) -> None:
        self.policy = policy
        self.outstanding = [0] * workers
        self._next = 0
        self._owner: dict[int, int] = {}
        if policy == "affinity":
            names = [f"w{i}" for i in range(workers)]
            placement = Placement(PARTITIONS, epsilon=EPSILON)
            placement.reconcile([WorkerView(name, slots) for name in names])
            self._owner = {p: names.index(w) for p, w in placement.assignment.items()}

    def pick(self, session: str) -> int:
        n = len(self.outstanding)
        if self.policy == "round_robin":
            worker = self._next % n
            self._next += 1
        elif self.policy == "least_loaded":
            worker = min(range(n), key=self.outstanding.__getitem__)  # ties: lowest index
        else:
            worker = self._owner[partition(session, PARTITIONS)]
        self.outstanding[worker] += 1
        return worker

    def done(self, worker: int) -> None:
        self.outstanding[worker] -= 1


@dataclass(frozen=True)
class _Step:
    session: int
    step: int
    worker: int
    timings: SimTimings | None  # None: the step failed


def _frame(seed: int, session: int, step: int) -> Image:
    # The hash names the frame, so the same (session, step) is the same image in
    # both prompts that carry it. The sim counts visual tokens from the size only.
    digest = hashlib.blake2b(f"{seed}:{session}:{step}".encode(), digest_size=16).hexdigest()
    return Image(hash=digest, data=b"", mime="image/png", width=FRAME[0], height=FRAME[1])


def _request(cfg: RouteConfig, session: int, step: int, history: list[str]) -> EngineRequest:
    frames = [_frame(cfg.seed, session, k) for k in range(max(0, step - 1), step + 1)]
    lines = "\n".join(f"{k}: {a}" for k, a in enumerate(history)) or "(none yet)"
    parts: list[TextPart | ImagePart] = [
        TextPart(text=f"Actions so far:\n{lines}\n"),
        *(ImagePart(hash=f.hash) for f in frames),  # the old frame first
        TextPart(text=f"Step {step}: what is the next action?"),
    ]
    return EngineRequest(
        request_id=f"s{session}-k{step}",
        messages=(
            ChatMessage(role="system", content=SYSTEM_PROMPT),
            ChatMessage(role="user", content=parts),
        ),
        images=tuple(frames),
        sampling=Sampling(max_tokens=MAX_TOKENS, temperature=0.0),
        constraint=JsonSchemaConstraint(json_schema=_ACTION_SCHEMA),
        session=f"s{session}",
    )


async def _generate(engine: SimEngine, request: EngineRequest) -> str | None:
    """The answer's text, or None when the engine refused or failed the request."""
    text: list[str] = []
    try:
        async for delta in engine.generate(request):
            text.append(delta.text)
            if delta.finish_reason in ("abort", "error"):
                return None
    except EngineError:
        return None
    return "".join(text)


async def _episode(
    cfg: RouteConfig, session: int, engines: list[SimEngine], router: _Router, out: list[_Step]
) -> None:
    history: list[str] = []
    for step in range(cfg.steps):
        request = _request(cfg, session, step, history)
        worker = router.pick(f"s{session}")
        try:
            answer = await _generate(engines[worker], request)
        finally:
            router.done(worker)
        timings = engines[worker].timings(request.request_id) if answer is not None else None
        out.append(_Step(session, step, worker, timings))
        history.append(answer if answer is not None else "(no answer)")


async def _run_policy(policy: Policy, cfg: RouteConfig) -> PolicyResult:
    settings = SimSettings(delay_scale=cfg.delay_scale, seed=cfg.seed)
    engines = [SimEngine(settings) for _ in range(cfg.workers)]
    router = _Router(policy, cfg.workers, settings.max_num_seqs)
    steps: list[_Step] = []
    started = time.perf_counter()
    for engine in engines:
        await engine.start()
    try:
        async with asyncio.TaskGroup() as tg:
            for session in range(cfg.sessions):
                tg.create_task(_episode(cfg, session, engines, router, steps))
    finally:
        for engine in engines:
            await engine.close()
    return _summarise(cfg, steps, time.perf_counter() - started)


def _hit_rate(timings: list[SimTimings]) -> float:
    prompt = sum(t.prompt_tokens for t in timings)
    return sum(t.cached_tokens for t in timings) / prompt if prompt else 0.0


def _summarise(cfg: RouteConfig, steps: list[_Step], wall: float) -> PolicyResult:
    ok = [(s, s.timings) for s in steps if s.timings is not None]
    timings = [t for _, t in ok]
    ttft = [t.ttft for t in timings if t.ttft is not None]
    busy = [0.0] * cfg.workers
    episode_s: defaultdict[int, float] = defaultdict(float)
    workers_of: defaultdict[int, list[int]] = defaultdict(list)
    for s, t in ok:
        busy[s.worker] += t.total - t.queue  # time it was being served, not waiting
        episode_s[s.session] += t.total
        workers_of[s.session].append(s.worker)
    mean_busy = statistics.fmean(busy)
    makespan = max(episode_s.values(), default=0.0)
    sticky = [max(Counter(ws).values()) / len(ws) for ws in workers_of.values()]
    return PolicyResult(
        steps=len(ok),
        failed=len(steps) - len(ok),
        prefix_hit_rate=round(_hit_rate(timings), 4),
        prefix_hit_rate_after_first=round(_hit_rate([t for s, t in ok if s.step > 0]), 4),
        ttft_p50_ms=round(percentile(ttft, 0.5) * 1000, 1),
        ttft_p99_ms=round(percentile(ttft, 0.99) * 1000, 1),
        step_p50_ms=round(percentile([t.total for t in timings], 0.5) * 1000, 1),
        step_p99_ms=round(percentile([t.total for t in timings], 0.99) * 1000, 1),
        load_imbalance=round(max(busy) / mean_busy, 3) if mean_busy else 0.0,
        throughput_steps_per_s=round(len(ok) / makespan, 2) if makespan else 0.0,
        makespan_s=round(makespan, 3),
        stickiness=round(statistics.fmean(sticky), 4) if sticky else 0.0,
        worker_busy_s=[round(b, 3) for b in busy],
        wall_s=round(wall, 2),
    )


def run_route_bench(cfg: RouteConfig, policies: tuple[Policy, ...] = POLICIES) -> RouteBench:
    """Run every policy, one after the other (so they do not share the CPU)."""

    async def run_all() -> dict[str, PolicyResult]:
        return {policy: await _run_policy(policy, cfg) for policy in policies}

    return RouteBench(cfg, asyncio.run(run_all()))
