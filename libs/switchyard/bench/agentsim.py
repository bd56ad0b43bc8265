"""`sy agent-sim`: cloud phones playing episodes against the fleet, straight onto NATS.

A phone captures a frame, sends the step (its current frame - and the previous
one for the `pair` layout - with the action history as text) on
`agent.in.<tenant>`, receives the answer on its reply inbox (its actions as the
worker parsed them, `GenerateResult.actions`) and executes them, `act_ms` each (a
chunk of up to K, `StepOptions.chunk`), before it captures the next frame. That
is the synchronous phone. With `asynchronous` ([S0] 2.3, asynchronous inference)
it captures and sends the next step while the chunk still executes, `lead_ms`
before the chunk ends (by default one action: when its last action starts), and
switches to a newer answer as soon as it has one, at the next action boundary
(the rest of the older chunk is dropped). When a chunk has ended and the answer it waits for is
not in, its screen has moved on since that step's frame: it sends a fresh step
at once, which supersedes the older one in the fleet. Answers that are not ok
(`stale`, `superseded`, errors) are never executed, nor an ok answer older than
one the phone already took. Each phone sends `steps` steps.

The phone's clock may be off (`clock_skew_s`): `created_at`, `frame_ts` and
`sent_at` are stamped from it, as a real phone's would be, and the fleet
estimates the offset per session (`services/preprocessor/clock.py`).

Without `--nats` it starts what it needs: an embedded NATS, the router,
`workers` worker processes of the chosen engine (with `gpu`, the sim's
calibration preset, `SY_SIM_GPU`) and the preprocessor laid out as `layout` /
`window` (`SY_AGENT_LAYOUT`, `SY_AGENT_WINDOW`), all for the VLM profile `vlm`
(`SY_AGENT_VLM` and the sim workers' `SY_SIM_VLM`: its visual-token size and
coordinates), each a subprocess as in production. With `--nats` those flags
must say what the running fleet uses.

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
Phone time is modelled time too: an action takes `act_ms` x `delay_scale` wall.

A closed loop only offers the load of N phones if the phones are not slowed by
the harness itself. A phone's time is spent executing actions or waiting on
inference with nothing to execute; `loop_efficiency` = what that time would have
been if every wait had ended when the fleet model says its answer was ready
(`ideal_wait`) / what it was, summed over the phones. Near 1 the phones wait on
the modelled fleet alone; below it this machine (frame drawing, preprocessing,
NATS hops, an event loop late to wake a phone) throttles them and the load is
lighter than N real phones would offer - raise `delay_scale` (slow the simulated
GPU's wall clock) until it is near 1. `wait_share` is the share of the phones'
time spent waiting on inference (modelled), `actions_per_phone_s` what they got
done per modelled second.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

from switchyard import eventloop, subjects
from switchyard.agentactions import Answer, encode_answer
from switchyard.agentprompt import (
    DEFAULT_LAYOUT,
    DEFAULT_WINDOW,
    MAX_WINDOW,
    AgentLayout,
    build_messages,
    fit,
    pending_text,
)
from switchyard.bench.layoutcost import frame_image, frame_steps
from switchyard.bench.phoneframes import draw_frame
from switchyard.bench.stats import Report, percentile
from switchyard.bus.connection import Bus, connect
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.capacity.calibration import (
    PRECISIONS,
    SIM_GPUS,
    Precision,
    SimGpu,
    calibration_of,
    frame_seconds,
    frame_tokens,
    sim_calibration,
    sim_decode_seconds,
)
from switchyard.capacity.errors import CapacityInputError
from switchyard.config import Settings
from switchyard.engines.base import SCHEDULING_POLICIES, EngineRequest, SchedulingPolicy
from switchyard.engines.prefix_cache import common_prefix
from switchyard.engines.sim import SimSettings
from switchyard.engines.sim_tokens import pseudo_tokens, render_prompt
from switchyard.errors import StreamTimeout
from switchyard.fleet import UNMETERED, FleetSpec, Pool, env_of, launch
from switchyard.fleet.spec import Engine, role_split
from switchyard.ids import new_id
from switchyard.messages.agent import (
    DEFAULT_ACTION_FORMAT,
    MAX_CHUNK,
    Action,
    ActionFormat,
    AgentStep,
    RawFrame,
    StepOptions,
)
from switchyard.messages.inference import Image, Timings
from switchyard.vlmgeometry import DEFAULT_VLM, VLM_NAMES, VlmName, vlm_profile

# The agent pool's per-step token budget (max_num_batched_tokens) per GPU calibration,
# where the best measured is not the engine's default (8,192): `sy agent-sim --engine sim
# --search --steps 6 --chunk 1 --act-ms 1200 --gpu G --budgets ...` (README, "Agent
# steps", 2026-12-07, Qwen3-VL frames, BF16). rtx5090: 256 -> under 6 phones, 512 -> 10
# (13 in one run of three), 1,024 -> 8, 8,192 -> 8 (10 failed in four runs): a 720p
# frame's prefill (~144 ms of the card at 880 tokens) otherwise lands whole in some
# other step's decode. h100
# (prefill ~3.5x faster): no budget measured better than the default 8,192 (p99 at 100
# phones: 8,192 335 ms, 512 362 ms, one run each, within this machine's run-to-run spread;
# above 100 the harness could not keep up). compose/docker-compose.yml (the 8 x RTX 5090
# server) sets the rtx5090 figure on its agent workers.
AGENT_TOKEN_BUDGET: dict[str, int] = {"rtx5090": 512}
READY_TIMEOUT = 180.0  # s: llama.cpp workers load their model on a shared machine
HISTORY_SENT = 200  # history entries a step carries (the tail: agentprompt numbers them)
NO_ACTION = "(none)"  # the history entry of a step whose answer the phone did not execute


class AgentSimConfigError(ValueError):
    """An `AgentSimConfig` that cannot describe a run (the CLI reports it as a bad option)."""


@dataclass(frozen=True)
class AgentSimConfig:
    phones: int = 8
    steps: int = 10
    engine: str = "llamacpp"
    workers: int = 1
    width: int = 1280
    height: int = 720
    max_pixels: int = 1280 * 720  # must match the preprocessor's, for the shared-prefix count
    # The VLM profile (SY_AGENT_VLM, SY_SIM_VLM): frames are counted in its visual tokens.
    vlm: VlmName = DEFAULT_VLM
    stale_after: float = 2.0
    # None: what the action format and chunk need (the preprocessor derives it, so no
    # answer is cut); a value asks for at least that many.
    max_tokens: int | None = None
    tenant: str = "phones"
    nats_url: str | None = None  # a running fleet: start nothing
    scatter: bool = False  # a new partition key per step: no session affinity
    step_timeout: float = 120.0
    # Wall seconds per modelled second for the sim workers this tool starts (SY_SIM_DELAY_SCALE);
    # with --nats, say what the running fleet uses, so measured parts convert to modelled time.
    delay_scale: float = 1.0
    # Frames per phone drawn before the run (cycled; `POOL_LOOKS` sets shared by the
    # phones); 0 = every phone draws its own frames during the run.
    frame_pool: int = 0
    frame_cache: int = 256  # the started preprocessor's prepared-frame cache (SY_FRAME_CACHE)
    stagger_s: float = 0.0  # phones start spread over this many wall seconds (no lockstep)
    # The preprocessor's prompt layout and window (set on the fleet this tool starts).
    layout: AgentLayout = DEFAULT_LAYOUT
    window: int = DEFAULT_WINDOW
    action_format: ActionFormat = DEFAULT_ACTION_FORMAT
    gpu: SimGpu | None = None  # the sim workers' calibration preset; None = the sim's default
    precision: Precision | None = None  # the sim workers' precision (SY_SIM_PRECISION)
    # The sim workers' per-step token budget (SY_SIM_MAX_NUM_BATCHED_TOKENS) and scheduling
    # policy (SY_SIM_SCHEDULING_POLICY); None = the agent pool's (`token_budget`) and the
    # sim's default policy.
    max_num_batched_tokens: int | None = None
    scheduling_policy: SchedulingPolicy | None = None
    # The started workers' roles as a split (`fleet.spec.role_split`: 6p2d = 6 prefill and
    # 2 decode workers, #39); None = every worker `both` (colocated).
    roles: str | None = None
    chunk: int = 1  # actions per answer (StepOptions.chunk)
    act_ms: float = 0.0  # modelled ms one action takes on the phone
    asynchronous: bool = False  # send the next step while the chunk executes
    lead_ms: float | None = None  # async: send that long before the chunk ends; None = act_ms
    clock_skew_s: float = 0.0  # the phone's clock minus the fleet's (wall s)
    # Steps of each phone left out of the latency percentiles and of its time (loop
    # efficiency, wait share, action rate): the ramp while the other phones are still
    # starting and the fleet is cold. Their errors and invalid actions still count.
    ramp_steps: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.chunk <= MAX_CHUNK:
            raise AgentSimConfigError(f"chunk is 1..{MAX_CHUNK}, got {self.chunk}")
        if not 1 <= self.window <= MAX_WINDOW:
            raise AgentSimConfigError(f"window is 1..{MAX_WINDOW}, got {self.window}")
        if self.act_ms < 0 or (self.lead_ms is not None and self.lead_ms < 0):
            raise AgentSimConfigError("act_ms and lead_ms are >= 0")
        if self.gpu is not None and self.gpu not in SIM_GPUS:
            raise AgentSimConfigError(f"gpu is one of {', '.join(SIM_GPUS)}, got {self.gpu!r}")
        if self.gpu is not None and self.engine != "sim":
            raise AgentSimConfigError("gpu picks a sim calibration: it needs engine sim")
        if self.precision is not None:
            if self.precision not in PRECISIONS or self.engine != "sim":
                raise AgentSimConfigError("precision is bf16 or fp8, for engine sim")
            try:  # fp8 on a card without FP8 (a100, the sim's default card) is refused here
                sim_calibration(self.gpu or "a100", precision=self.precision)
            except CapacityInputError as e:
                raise AgentSimConfigError(e.reason) from None
        sim_only = (self.max_num_batched_tokens, self.scheduling_policy)
        if self.engine != "sim" and any(v is not None for v in sim_only):
            raise AgentSimConfigError("the token budget and scheduling policy need engine sim")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise AgentSimConfigError("max_num_batched_tokens is >= 1")
        if self.scheduling_policy not in (None, *SCHEDULING_POLICIES):
            raise AgentSimConfigError(
                f"scheduling_policy is one of {', '.join(SCHEDULING_POLICIES)}, "
                f"got {self.scheduling_policy!r}"
            )
        if not 0 <= self.ramp_steps < self.steps:
            raise AgentSimConfigError(f"ramp_steps is 0..steps-1, got {self.ramp_steps}")
        if self.vlm not in VLM_NAMES:
            raise AgentSimConfigError(f"vlm is one of {', '.join(VLM_NAMES)}, got {self.vlm!r}")
        if self.roles is not None:
            try:
                split = role_split(self.roles)
            except ValueError as e:
                raise AgentSimConfigError(str(e)) from None
            if len(split) != self.workers:
                raise AgentSimConfigError(
                    f"roles {self.roles} name {len(split)} workers, not {self.workers}"
                )
            if ("prefill" in split) != ("decode" in split):
                raise AgentSimConfigError(f"roles {self.roles}: prefill and decode go together")

    @property
    def token_budget(self) -> int | None:
        """The sim workers' budget: the one asked for, else the agent pool's for the GPU
        (`AGENT_TOKEN_BUDGET`), else None (the engine's default)."""
        if self.max_num_batched_tokens is not None or self.engine != "sim":
            return self.max_num_batched_tokens
        return AGENT_TOKEN_BUDGET.get(self.gpu or SimSettings().gpu)

    @property
    def scale(self) -> float:
        """Wall seconds per modelled second of phone time (1 when the sim runs instantly)."""
        return self.delay_scale or 1.0

    @property
    def lead_s(self) -> float:
        """Wall seconds before a chunk's end at which the next step leaves (0: sync)."""
        if not self.asynchronous:
            return 0.0
        return (self.act_ms if self.lead_ms is None else self.lead_ms) / 1000 * self.scale


@dataclass
class StepRecord:
    phone: int
    step: int
    status: str
    latency_s: float
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
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
    calibration: str | None = None  # what the sim engine modelled it at
    evicted_active: int = 0  # KV blocks of active sessions its admission evicted (sim)
    worker: str | None = None  # the worker that answered it
    sent: float = 0.0  # wall (perf_counter) when the step was published
    actions: int = 0  # actions in its answer (when valid)
    executed: bool = False  # the phone took this answer (maybe not to its last action)
    overtaken: bool = False  # ok, but the phone had already taken a newer step's answer
    late: bool = False  # ok, but its frame outlived stale_after before the phone could act
    early: bool = False  # sent while a chunk still executed (async: its lead)
    taken_at: float | None = None  # wall, when the phone took the answer (its chunk began)

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
class PhoneTime:
    """One phone's time, wall seconds (perf_counter): what it did, and what it should have
    taken had only the fleet model and its own actions taken time."""

    start: float = 0.0  # after the ramp (`AgentSimConfig.ramp_steps`)
    end: float = 0.0
    acting: float = 0.0  # executing actions (intended: act_ms x scale each)
    waiting: float = 0.0  # waiting on inference with nothing to execute (measured)
    waiting_ideal: float = 0.0  # the same waits, ended when the fleet model had the answer
    actions: int = 0  # executed
    switches: int = 0  # newer answers taken while a chunk still had actions left
    dropped: int = 0  # actions of chunks left unfinished for a newer answer
    # One entry per chunk that ended and was followed by another: how long the phone then
    # stood still with nothing to execute until its next answer (modelled seconds, as
    # `ideal_wait` ends the wait; 0 when the successor was in before the chunk ended).
    stalls: list[float] = field(default_factory=list)
    pending_tokens: list[int] = field(default_factory=list)  # per step sent with `pending`

    @property
    def loop(self) -> float:
        return self.end - self.start

    @property
    def ideal(self) -> float:
        return self.acting + self.waiting_ideal


def ideal_wait(start: float, end: float, sent: float, modelled_s: float | None, k: float) -> float:
    """How long a wait from `start` to `end` (wall) should have been: until `sent` + the
    answer's modelled latency (x `k`, wall per modelled second), within 0..the real wait.

    Without a modelled latency (not an executable answer of the sim) the whole wait
    counts as the fleet's: the harness is not blamed for what cannot be told apart.
    """
    real = max(0.0, end - start)
    if modelled_s is None:
        return real
    return min(real, max(0.0, sent + modelled_s * k - start))


@dataclass
class ModelledLatency:
    """The fleet-model part of the steps' latency (see the module docstring), in ms."""

    delay_scale: float
    steps: int  # steps the figure covers (all sent, less the ramp and superseded ones)
    p50_ms: float
    p99_ms: float  # a step not answered ok counts as infinitely late (inf)
    p50_parts_ms: dict[str, float]  # median of each component
    tail_parts_ms: dict[str, float]  # mean of each component over the steps at or above p99
    limit: str  # the largest tail component group: queueing, prefill or decode
    loop_efficiency: float
    # The tail's answers: output tokens, and what their decode would take on an otherwise
    # idle GPU of the calibration (batch of one); the rest of `tail_parts_ms["decode"]` is
    # decode steps that shared the GPU with other steps' prefill. None off the sim presets.
    tail_output_tokens: float
    tail_decode_alone_ms: float | None
    harness_frame_p50_ms: float  # the phone drawing a frame (wall)
    outside_p50_ms: float  # wall - admission->answer: preprocess CPU, NATS hops, reply (wall)
    outside_p99_ms: float


@dataclass
class AgentSimReport(Report):
    config: AgentSimConfig
    steps: int
    ok: int
    stale: int
    superseded: int  # answered `superseded`: a newer step of the phone replaced it
    errors: dict[str, int]  # status:code of the rest (cut answers among them)
    invalid_actions: int  # answered ok, but not a valid answer in the step's format
    cut_answers: int  # answered `answer_cut`: stopped at max_tokens or not in the format
    # KV blocks of active sessions evicted to admit a step (sim: `engines.sim`, "Active
    # sessions"): each is a prefix some phone's next step computes again.
    active_evictions: int
    latency_p50_ms: float
    latency_p99_ms: float
    prefix_hit_rate: float  # steps after the first: cached / prompt tokens
    prefix_hit_rate_first_step: float
    reuse_efficiency: float  # steps after the first: cached / shared-with-previous tokens
    actions_per_s: float  # ok steps answered per wall second
    actions_executed: int  # by all phones
    actions_per_phone_s: float  # executed per phone per modelled second
    wait_share: float  # of the phones' time spent waiting on inference (modelled)
    wait_share_wall: float  # the same, as measured on this machine
    overtaken: int  # ok answers not executed: the phone had a newer one
    switches: int  # newer answers taken before the chunk ended (async)
    calibration: str | None  # what the sim engine modelled the steps at (from the results)
    steps_per_s: float  # steps sent per modelled second, all phones
    prefill_busy: float | None  # share of each GPU's time spent on prefill (sim, modelled)
    # The most phones one worker served (each phone counted at the worker that answered
    # most of its steps), and the workers that served any: how evenly sessions were placed.
    phones_per_worker_max: int
    workers_used: int
    wall_s: float
    # What the phone feels (`PhoneTime.stalls`, modelled): after each chunk that had a
    # successor, how long it stood with nothing to execute; `starved_share` of those chunk
    # ends found no successor in. Sync phones stand for every step's whole latency.
    chunk_ends: int = 0
    stall_p50_ms: float = 0.0
    stall_p99_ms: float = 0.0
    starved_share: float = 0.0
    pending_tokens_mean: float = 0.0  # tokens the `pending` text adds to a step that has it
    # Ok answers the phone refused: their frame had outlived `stale_after` by the time it
    # could act on them (`_Phone._take`). The fleet withholds an answer ready too late; one
    # ready in time can still reach the phone too late (the reply's hops, an action to end).
    refused_late: int = 0
    notes: list[str] = field(default_factory=list)
    modelled: ModelledLatency | None = None


class _PrefixModel:
    """The sim tokenizer's view of a phone's prompts, to count the shared prefix.

    `layout` and `window` must be the preprocessor's (`SY_AGENT_LAYOUT`,
    `SY_AGENT_WINDOW`): they decide which frames a step's prompt holds
    (`layoutcost.frame_steps`; for `window` the ideal window, which the
    preprocessor keeps unless it loses it).
    """

    def __init__(self, cfg: AgentSimConfig, layout: AgentLayout = "pair", window: int = 8) -> None:
        self.size = fit(cfg.width, cfg.height, cfg.max_pixels, vlm_profile(cfg.vlm).patch_px)
        self.sim = SimSettings(vlm=cfg.vlm)
        self.vlm = cfg.vlm
        self.pool = cfg.frame_pool
        self.layout: AgentLayout = layout
        self.window = window

    def tokens(self, step: AgentStep, phone: int) -> list[str]:
        steps = frame_steps(self.layout, step.step, self.window, sent=len(step.frames))
        frames = [self._image(phone, k) for k in steps]
        messages = build_messages(step, frames, self.layout, self.vlm)
        req = EngineRequest(request_id=step.id, messages=tuple(messages), images=tuple(frames))
        return render_prompt(req, self.sim)

    def _image(self, phone: int, k: int) -> Image:
        # With a frame pool, step k shows pool frame k % pool: the same image, the same hash.
        return frame_image(str(phone), k % self.pool if self.pool else k, self.size)


# Drawn once per process: a capacity search runs many loads with the same phones.
_pool_frame = functools.lru_cache(maxsize=None)(draw_frame)
# Distinct sets of pool frames; phone p shows set p % POOL_LOOKS. Shared so that the
# preprocessor decodes (and the harness draws) a few dozen frames per run, not two per
# phone, which at hundreds of phones is a burst of CPU this machine cannot absorb. It
# costs the GPU model nothing: a frame follows its phone's own goal and history in
# every layout, so no prefix block is shared across phones (and the sim has no
# vision-encoder cache to share).
POOL_LOOKS = 8


def frame_pool(cfg: AgentSimConfig, phone: int) -> list[bytes]:
    look, size = phone % POOL_LOOKS, (cfg.width, cfg.height)
    return [_pool_frame(look, j, size) for j in range(cfg.frame_pool)]


def history_entry(actions: Sequence[Action], fmt: ActionFormat) -> str:
    """A step's actions as the phone records them: each in the step's format, joined by
    `; ` (one line per step, as the prompt numbers them). `grid` cannot write a phone's
    pixels: its steps are recorded as `compact` lines."""
    fmt = "compact" if fmt == "grid" else fmt
    return "; ".join(encode_answer(Answer((a,)), fmt) for a in actions)


class _Phone:
    """One phone's episode: capture, send, execute chunks (see the module docstring)."""

    def __init__(
        self, cfg: AgentSimConfig, bus: Bus, run: str, phone: int, model: _PrefixModel,
        out: list[StepRecord], pool: list[bytes], clock: PhoneTime,
    ) -> None:  # fmt: skip
        self.cfg, self.bus, self.run_id, self.phone = cfg, bus, run, phone
        self.model, self.out, self.pool, self.time = model, out, pool, clock
        self.answers: asyncio.Queue[tuple[StepRecord, list[Action]]] = asyncio.Queue()
        # One entry per step sent (so its index is the step): the actions of its answer
        # once the phone takes it, `NO_ACTION` until then or if it never does.
        self.history: list[str] = []
        self.inflight: dict[int, float] = {}  # step -> when its frame was captured (wall)
        self.taken = -1  # the newest step whose answer the phone took
        self.screen_at = 0.0  # when the screen last changed (an action ended), wall
        self.prev: bytes | None = None
        self.prev_tokens: list[str] | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        cfg, t = self.cfg, self.time
        if cfg.stagger_s > 0:  # real phones are not in lockstep: spread the first steps
            await asyncio.sleep(cfg.stagger_s * self.phone / cfg.phones)
        t.start = self.screen_at = time.perf_counter()
        act = cfg.act_ms / 1000 * cfg.scale
        chunk: list[Action] = []
        sent_for_chunk = False
        stalled: float | None = None  # wall, when the chunk ended with no successor yet
        try:
            while True:
                if not chunk:
                    if stalled is None and t.actions:
                        stalled = self.screen_at  # the last action ended: the phone stands
                    # Nothing to execute: send a step unless one in flight already shows
                    # this screen (sync: none is in flight; async: the one sent during
                    # the chunk shows the screen before its last action ended).
                    newest = max(self.inflight.values(), default=None)
                    if len(self.history) < cfg.steps and (
                        newest is None or newest < self.screen_at
                    ):
                        await self._send()
                    if not self.inflight:
                        break
                    began = time.perf_counter()
                    rec, actions = await self.answers.get()
                    ended = time.perf_counter()
                    took = self._take(rec, actions)
                    t.waiting += ended - began
                    model = rec.modelled(cfg.delay_scale) if took else None
                    t.waiting_ideal += ideal_wait(began, ended, rec.sent, model, cfg.scale)
                    if took:
                        chunk, sent_for_chunk = list(actions), False
                        if stalled is not None:
                            stood = ideal_wait(stalled, ended, rec.sent, model, cfg.scale)
                            t.stalls.append(stood / cfg.scale)
                            stalled = None
                    continue
                # One action. The next step leaves `lead` before the chunk's end (async).
                until_send = len(chunk) * act - cfg.lead_s
                executing = chunk.pop(0)
                if (
                    cfg.lead_s > 0 and not sent_for_chunk and until_send < act
                    and len(self.history) < cfg.steps
                ):  # fmt: skip
                    await asyncio.sleep(max(0.0, until_send))
                    # The action under way and the rest of the chunk: what the answer
                    # must continue after (real-time chunking's inpainting).
                    await self._send(pending=[executing, *chunk])
                    sent_for_chunk = True
                    await asyncio.sleep(act - max(0.0, until_send))
                else:
                    await asyncio.sleep(act)
                t.acting += act
                t.actions += 1
                self.screen_at = time.perf_counter()
                # Answers that came during the action: a newer one replaces the chunk.
                while not self.answers.empty():
                    rec, actions = self.answers.get_nowait()
                    if self._take(rec, actions):
                        if not chunk:
                            t.stalls.append(0.0)  # the chunk ended with its successor in
                        t.switches += bool(chunk)
                        t.dropped += len(chunk)
                        chunk, sent_for_chunk = list(actions), False
        finally:
            t.end = time.perf_counter()
            for task in list(self.tasks):  # only after an error: every step is awaited
                task.cancel()

    def _take(self, rec: StepRecord, actions: list[Action]) -> bool:
        """Whether the phone executes this answer: valid, newer than any it took, and its
        frame still within `stale_after` now - a stale step is never executed, whoever
        held it up (the fleet withholds an answer ready too late; the phone refuses one
        that reached it, or an action boundary, too late)."""
        captured = self.inflight.pop(rec.step, rec.sent)
        if not rec.valid:
            return False
        if rec.step <= self.taken:
            rec.overtaken = True
            return False
        if time.perf_counter() - captured > self.cfg.stale_after:
            rec.late = True
            return False
        self.taken, rec.executed, rec.taken_at = rec.step, True, time.perf_counter()
        self.history[rec.step] = history_entry(actions, self.cfg.action_format)
        return True

    async def _send(self, *, pending: Sequence[Action] = ()) -> None:
        """Send the phone's next step; `pending`: the chunk's actions still to execute
        (async: the step leaves while they run)."""
        cfg, k = self.cfg, len(self.history)
        captured = time.perf_counter()
        if k == cfg.ramp_steps > 0:
            # The ramp is over: the phone's time counts from the first step it measures
            # (sync: after the ramp's last chunk ran; async: during its last action).
            t = self.time
            t.start, t.acting, t.waiting, t.waiting_ideal = captured, 0.0, 0.0, 0.0
            t.actions = t.switches = t.dropped = 0
            t.stalls, t.pending_tokens = [], []
        size = (cfg.width, cfg.height)
        cur = (
            self.pool[k % len(self.pool)] if self.pool
            else await asyncio.to_thread(draw_frame, self.phone, k, size)
        )  # fmt: skip
        frame_s = time.perf_counter() - captured
        # `single` and `window` lay out the current frame only: a previous one would be
        # bytes on the bus for nothing.
        raw = [self.prev, cur] if self.prev is not None and cfg.layout == "pair" else [cur]
        session = f"{self.run_id}-p{self.phone}" + (f"-s{k}" if cfg.scatter else "")
        now = time.time() + cfg.clock_skew_s  # the phone's own clock
        step = AgentStep(
            tenant=cfg.tenant, session=session, created_at=now, frame_ts=now, sent_at=now,
            frames=[RawFrame(data=f, mime="image/jpeg") for f in raw],
            # The episode in the goal: another run (or load of a search) on the same fleet
            # draws the same frames and actions, and must not find its prompts cached.
            goal=f"collect the daily reward (episode {self.run_id}-p{self.phone})",
            history=self.history[-HISTORY_SENT:], step=k, stale_after=cfg.stale_after,
            pending=[history_entry([a], cfg.action_format) for a in pending],
            options=StepOptions(chunk=cfg.chunk, action_format=cfg.action_format,
                                max_tokens=cfg.max_tokens),
        )  # fmt: skip
        self.history.append(NO_ACTION)
        if step.pending:
            self.time.pending_tokens.append(len(pseudo_tokens(pending_text(step.pending))))
        tokens = self.model.tokens(step, self.phone)
        shared = common_prefix(self.prev_tokens, tokens) if self.prev_tokens is not None else 0
        self.prev, self.prev_tokens = cur, tokens
        self.inflight[k] = captured
        task = asyncio.create_task(self._ask(step, shared, frame_s, bool(pending)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _ask(self, step: AgentStep, shared: int, frame_s: float, early: bool) -> None:
        """Send `step`, wait for its answer, and hand the phone its record and actions."""
        rec = StepRecord(self.phone, step.step, "lost", 0.0, shared_tokens=shared,
                         frame_s=frame_s, early=early)  # fmt: skip
        actions: list[Action] = []
        try:
            async with TokenStreamReader(self.bus.nc, idle_timeout=self.cfg.step_timeout) as rd:
                rec.sent = time.perf_counter()
                sent = step.model_copy(update={"reply": rd.inbox})
                await publish(self.bus.js, subjects.agent_in(self.cfg.tenant), sent, msg_id=step.id)
                frames = [f async for f in rd]
            rec.latency_s = time.perf_counter() - rec.sent
            last = frames[-1] if frames else None
            if last is not None and last.result is not None:
                res = last.result
                rec.status, rec.code = res.status, res.error.code if res.error else None
                rec.worker = res.worker
                rec.prompt_tokens = res.usage.prompt_tokens
                rec.cached_tokens = res.usage.cached_tokens
                rec.output_tokens = res.usage.completion_tokens
                _timings_into(rec, res.timings)
                if res.status == "ok" and res.actions is not None:
                    # The worker's output step parsed and checked it, in the phone's pixels.
                    actions, rec.valid = list(res.actions), True
                    rec.actions = len(actions)
            elif last is not None and last.error is not None:
                rec.status, rec.code = "rejected", last.error.code
        except StreamTimeout:
            rec.latency_s, rec.code = time.perf_counter() - rec.sent, "timeout"
        finally:
            # Whatever happened, the phone hears of it: it must never wait for nothing.
            self.out.append(rec)
            self.answers.put_nowait((rec, actions))


def _timings_into(rec: StepRecord, t: Timings) -> None:
    rec.fleet_s = t.total
    if t.router is not None:
        rec.router_s = t.router
        rec.dispatch_s = max(0.0, t.queue - t.router)
    if t.modelled is not None:
        m = t.modelled
        rec.engine_queue_s, rec.prefill_s, rec.decode_s = m.queue, m.prefill, m.decode
        rec.calibration = m.calibration
        rec.evicted_active = m.evicted_active


def _ms(x: float) -> float:
    return round(x * 1000, 1) if math.isfinite(x) else math.inf


def modelled_latency(
    recs: Sequence[StepRecord], scale: float, loop_s: float, ideal_s: float
) -> ModelledLatency | None:
    """The modelled-latency summary of `recs`, or None if no step carried the engine's model.

    Steps not answered ok count as infinitely late, so p99 <= target means 99 % were
    served ok within it. `loop_s` and `ideal_s`: the phones' summed time and what it
    should have been (`PhoneTime`), for the loop efficiency.
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
    return ModelledLatency(
        delay_scale=scale, steps=len(recs),
        p50_ms=_ms(percentile(values, 0.5)), p99_ms=_ms(p99),
        p50_parts_ms={n: _ms(percentile([p[n] for p in parts], 0.5)) for n in names},
        tail_parts_ms={n: _ms(v) for n, v in tail_mean.items()},
        limit=max(groups, key=lambda g: groups[g]),
        loop_efficiency=round(min(1.0, ideal_s / loop_s), 3) if loop_s > 0 else 0.0,
        tail_output_tokens=round(sum(r.output_tokens for r in tail) / len(tail), 1),
        tail_decode_alone_ms=_decode_alone_ms(tail),
        harness_frame_p50_ms=_ms(percentile([r.frame_s for r in recs], 0.5)),
        outside_p50_ms=_ms(percentile(outside, 0.5)), outside_p99_ms=_ms(percentile(outside, 0.99)),
    )  # fmt: skip


def _decode_alone_ms(recs: Sequence[StepRecord]) -> float | None:
    """Mean decode time of `recs`' answers alone on their calibration's GPU (batch of one)."""
    alone = []
    for r in recs:
        cal = calibration_of(r.calibration)
        if cal is None:
            return None
        alone.append(r.output_tokens * sim_decode_seconds(cal, 1))
    return _ms(sum(alone) / len(alone)) if alone else None


def _calibration(recs: Sequence[StepRecord]) -> str | None:
    names = sorted({r.calibration for r in recs if r.calibration})
    return ",".join(names) or None


def _steady(times: Sequence[PhoneTime]) -> tuple[float, float]:
    """The wall span in which every phone ran (after the last started, before the first
    ended); the whole run when there is none (one phone, or a short run)."""
    lo, hi = max(t.start for t in times), min(t.end for t in times)
    if hi - lo <= 0:
        lo, hi = min(t.start for t in times), max(t.end for t in times)
    return lo, hi


def _rates(
    cfg: AgentSimConfig, recs: Sequence[StepRecord], times: Sequence[PhoneTime],
    calibration: str | None,
) -> tuple[float, float | None]:  # fmt: skip
    """Steps sent per modelled second, all phones, and the share of each GPU's modelled
    time that their prefill took, while every phone ran (`_steady`)."""
    if not times or not recs:
        return 0.0, None
    lo, hi = _steady(times)
    span = (hi - lo) / cfg.scale
    inside = [r for r in recs if lo <= r.sent <= hi]
    if span <= 0:
        return 0.0, None
    rate = len(inside) / span
    cal = calibration_of(calibration)
    if cfg.engine != "sim" or cal is None:
        return round(rate, 2), None
    # A token's share of a whole frame's GPU time (its encoder pass included), as
    # `frame_seconds` defines it: uncached tokens are mostly new frames.
    per_token = frame_seconds(cal) / (frame_tokens(cal.model)[0] + 2)
    uncached = sum(max(0, r.prompt_tokens - r.cached_tokens) for r in inside)
    return round(rate, 2), round(uncached * per_token / span / max(1, cfg.workers), 3)


def _placement(recs: Sequence[StepRecord]) -> tuple[int, int]:
    """(the most phones on one worker, workers that answered any step)."""
    served: dict[int, Counter[str]] = {}
    for r in recs:
        if r.worker is not None:
            served.setdefault(r.phone, Counter())[r.worker] += 1
    home = Counter(c.most_common(1)[0][0] for c in served.values())
    used = {r.worker for r in recs if r.worker is not None}
    return max(home.values(), default=0), len(used)


def summarise(
    cfg: AgentSimConfig, recs: list[StepRecord], wall: float,
    times: Sequence[PhoneTime] = (),
) -> AgentSimReport:  # fmt: skip
    ok = [r for r in recs if r.status == "ok"]
    later = [r for r in ok if r.step > 0]
    first = [r for r in ok if r.step == 0]
    not_ok = [r for r in recs if r.status not in ("ok", "stale", "superseded")]
    errors = dict(Counter(f"{r.status}:{r.code}" for r in not_ok))

    cached = sum(r.cached_tokens for r in later)

    def ratio(num: float, den: float) -> float:
        return round(num / den, 4) if den else 0.0

    loop_s = sum(t.loop for t in times)
    ideal_s = sum(t.ideal for t in times)
    # A superseded step is the phone's own choice (it sent a fresher one), not a late one.
    timed = [r for r in recs if r.step >= cfg.ramp_steps and r.status != "superseded"]
    modelled = modelled_latency(timed, cfg.delay_scale, loop_s, ideal_s)
    calibration = _calibration(recs)
    steps_per_s, prefill_busy = _rates(cfg, recs, times, calibration)
    executed = sum(t.actions for t in times)
    most, used = _placement(recs)
    stalls = [x for t in times for x in t.stalls]
    pending = [n for t in times for n in t.pending_tokens]
    notes = [
        "latency: wall clock on this machine, publish to action, all services sharing its CPUs",
        "shared prefix counted with the sim tokenizer (exact for --engine sim)",
        f"phones: {'async' if cfg.asynchronous else 'sync'}, chunk {cfg.chunk}, "
        f"{cfg.act_ms:g} ms per action"
        + (f", next step {cfg.lead_s / cfg.scale * 1000:g} ms before a chunk ends"
           if cfg.asynchronous else ""),
    ]  # fmt: skip
    if modelled is not None:
        notes.append(
            "modelled: router + dispatch (measured, wall / delay_scale) + the sim engine's "
            "modelled queue, prefill and decode; harness frame drawing and everything outside "
            "admission->answer (preprocessing, NATS hops) reported apart, in wall ms"
        )
    if cfg.ramp_steps:
        notes.append(f"percentiles leave out each phone's first {cfg.ramp_steps} step(s) (ramp)")
    if cfg.gpu is not None and calibration is not None and cfg.gpu != calibration.split("+")[0]:
        notes.append(f"asked for gpu {cfg.gpu}, but the fleet modelled {calibration}")
    return AgentSimReport(
        config=cfg,
        steps=len(recs),
        ok=len(ok),
        stale=sum(r.status == "stale" for r in recs),
        superseded=sum(r.status == "superseded" for r in recs),
        errors=errors,
        invalid_actions=sum(not r.valid for r in ok),
        cut_answers=sum(r.code == "answer_cut" for r in recs),
        active_evictions=sum(r.evicted_active for r in recs),
        latency_p50_ms=round(percentile([r.latency_s for r in ok], 0.5) * 1000, 1),
        latency_p99_ms=round(percentile([r.latency_s for r in ok], 0.99) * 1000, 1),
        prefix_hit_rate=ratio(cached, sum(r.prompt_tokens for r in later)),
        prefix_hit_rate_first_step=ratio(
            sum(r.cached_tokens for r in first), sum(r.prompt_tokens for r in first)
        ),
        reuse_efficiency=ratio(cached, sum(r.shared_tokens for r in later)),
        actions_per_s=round(len(ok) / wall, 2) if wall else 0.0,
        actions_executed=executed,
        actions_per_phone_s=round(ratio(executed, loop_s / cfg.scale), 3),
        wait_share=ratio(sum(t.waiting_ideal for t in times), ideal_s),
        wait_share_wall=ratio(sum(t.waiting for t in times), loop_s),
        overtaken=sum(r.overtaken for r in recs),
        switches=sum(t.switches for t in times),
        calibration=calibration,
        steps_per_s=steps_per_s,
        prefill_busy=prefill_busy,
        phones_per_worker_max=most,
        workers_used=used,
        wall_s=round(wall, 2),
        chunk_ends=len(stalls),
        stall_p50_ms=_ms(percentile(stalls, 0.5)),
        stall_p99_ms=_ms(percentile(stalls, 0.99)),
        starved_share=ratio(sum(x > 0 for x in stalls), len(stalls)),
        pending_tokens_mean=round(sum(pending) / len(pending), 1) if pending else 0.0,
        refused_late=sum(r.late for r in recs),
        notes=notes,
        modelled=modelled,
    )  # fmt: skip


@contextlib.contextmanager
def agent_fleet(cfg: AgentSimConfig) -> Iterator[str]:
    """The NATS URL of a fleet that serves the `agent` pool, once it is ready."""
    if cfg.nats_url:
        yield cfg.nats_url
        return
    sim: dict[str, str] = {}
    if cfg.engine == "sim":
        chosen = {  # None: the sim's own default
            "sim_gpu": cfg.gpu, "sim_precision": cfg.precision,
            "sim_max_num_batched_tokens": cfg.token_budget,
            "sim_scheduling_policy": cfg.scheduling_policy,
        }  # fmt: skip
        sim = env_of(sim_delay_scale=cfg.delay_scale, sim_vlm=cfg.vlm,
                     **{k: v for k, v in chosen.items() if v is not None})  # fmt: skip
    preprocessor = env_of(
        frame_procs=1, max_pixels=cfg.max_pixels, frame_cache=cfg.frame_cache,
        agent_layout=cfg.layout, agent_window=cfg.window, agent_vlm=cfg.vlm,
    )  # fmt: skip
    spec = FleetSpec(
        pools=(Pool("agent", cfg.workers, sim, role_split(cfg.roles) if cfg.roles else ()),),
        engine=cast(Engine, cfg.engine),
        # A load tool measures the fleet, not the default quotas: give its tenant room.
        tenant_policy=UNMETERED, service_env={"preprocessor": preprocessor},
    )  # fmt: skip
    with launch(spec, ready_timeout=READY_TIMEOUT) as fleet:
        yield fleet.nats_url


@dataclass
class Played:
    """What the phones of one run did: every step's record, every phone's time."""

    records: list[StepRecord]
    times: list[PhoneTime]
    wall_s: float


async def play(cfg: AgentSimConfig, url: str) -> Played:
    """`cfg.phones` phones, `cfg.steps` steps each, against the fleet at `url`."""
    pools = [frame_pool(cfg, p) for p in range(cfg.phones)] if cfg.frame_pool else []
    bus = await connect(Settings(nats_url=url), "agent-sim")
    model = _PrefixModel(cfg, cfg.layout, cfg.window)
    recs: list[StepRecord] = []
    times = [PhoneTime() for _ in range(cfg.phones)]
    run = new_id().lower()[-10:]
    t0 = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as tg:
            for p in range(cfg.phones):
                phone = _Phone(cfg, bus, run, p, model, recs, pools[p] if pools else [], times[p])
                tg.create_task(phone.run())
    finally:
        await bus.close()
    return Played(recs, times, time.perf_counter() - t0)


async def drive(cfg: AgentSimConfig, url: str) -> AgentSimReport:
    """`play`, summarised."""
    played = await play(cfg, url)
    return summarise(cfg, played.records, played.wall_s, played.times)


def run_agent_sim(cfg: AgentSimConfig) -> AgentSimReport:
    with agent_fleet(cfg) as url:
        return eventloop.run(drive(cfg, url))
