"""A simulator of ONE vLLM GPU engine, for router and load work on CPU.

`SimEngine` (kind ``"sim"``) is a simulator, not a model: it produces no
meaningful text. It reproduces what a router and a load test can observe of a
vLLM engine: continuous batching up to `max_num_seqs`, a paged KV cache of
16-token blocks with prefix caching (chained block hashes, cache salt, LRU
eviction), chunked prefill that serialises the compute of uncached prompt tokens
(TTFT grows with them and with the prefills ahead), TPOT that grows with the batch
and with the prefill a step carries, and outputs of the requested shape (exactly
`max_tokens`, or a JSON instance of the requested schema).

Time model (virtual seconds; the wall clock follows it times `delay_scale`). The
engine runs in steps, as vLLM's scheduler does with chunked prefill (on by default):

- Each step serves every decoding sequence one token and, with what is left of a
  token budget of `max_num_batched_tokens` (a decoding sequence takes one token of
  it), prefill chunks of admitted sequences in the policy's order (below); a prompt
  longer than what is left is chunked over the following steps (vLLM: decodes first,
  then pending prefills, chunked to fit).
- step(B, P) = step_overhead + tpot_base + tpot_per_seq * B + prefill_cost_per_token * P,
  B = sequences in the step (decoding and prefilling), P = prefill tokens it carries.
  A step without prefill is the decode step TPOT(B), bandwidth-bound; prefill is
  compute-bound and serialised through the steps: N frames arriving together cost
  N times one frame's prefill before the last one's first token, and the sequences
  decoding meanwhile see the longer steps (ITL spikes).
- A request is admitted when a slot and its KV blocks are free, waits for the step
  under way to end (alignment), then its chunks ride the next steps; the step that
  carries its last chunk emits its first token, each later step one more.
  So TTFT = queue + alignment + the steps until its prefill is done; the timings
  (`SimTimings`) keep queue, prefill (step boundary -> first token) and the rest.
- `scheduling_policy` orders who goes first, as vLLM v1's scheduler does
  (vllm/v1/core/sched/scheduler.py, request_queue.py; vLLM 0.32): `fcfs` by arrival;
  `priority` by `EngineRequest.priority` (earliest due time first), then arrival,
  both in the waiting queue (head-of-line: a head that does not fit blocks the rest)
  and among admitted prompts whose prefill has not begun (vLLM keeps those waiting).
  A prompt whose prefill has begun keeps its place (vLLM's running list is in
  schedule order, never re-sorted). vLLM's other priority behaviour, preempting the
  lowest-priority running request when KV blocks run out, is not modelled: the sim
  reserves a request's blocks at admission, so a running request never runs out.
- Speculative decoding (`speculative_tokens` > 0, vLLM's n-gram proposer): a decoding
  sequence's step verifies the tokens drafted for it (`sim_output.ngram_steps`, planned
  with its output) and emits the accepted ones and one more; each drafted token takes
  one token of the step's budget and costs `prefill_cost_per_token`, as the forward
  pass computes it like a prefill token (an additive upper bound: at a small batch a
  real decode step has idle compute to verify in).
- Timings are exact and deterministic at delay_scale 0 (arrivals then land on step
  boundaries); above 0 an arrival lands where the wall clock puts it in the step
  under way, so alignment averages half a step.

The hardware figures (`gpu`: step_overhead, tpot_base, tpot_per_seq,
prefill_cost_per_token, kv_capacity_tokens) come from a calibration preset
(`switchyard.capacity.calibration`: `a100`, the default and the one measured point,
`h100`, `rtx5090`); a figure set explicitly overrides the preset's, and
`SimSettings.calibration` labels every figure the engine produces with what ran.

Every request's modelled timings are kept (see `SimEngine.timings`) so tests
and load tools can read exact, noise-free numbers instead of wall-clock ones.

Active sessions. An agent episode's next step reuses what its last one left in the KV
cache; evicting that between its steps costs it a whole prefill again. The engine counts
such evictions (`SimTimings.evicted_active`: blocks of active sessions that a request's
admission evicted; `evicted_active_blocks` in total). A session (the request's tenant
and `session`) is **active** while a request of it is in the engine, and after its last
step arrived for twice its last interval between steps: an episode is a closed loop, so
its next step is due about one interval later, and twice that still covers a phone that
acts longer this time (the route bench draws act times of 0.5-1.5x their mean) without
counting an episode that has ended for long. Before its second step its interval is not
known: then `active_session_s` (30 s, the router's `warm_seconds`) stands in for it.

This module holds the engine, its settings and its timing record; the parts it
is built from live beside it:

- `sim_tokens`: the pseudo-tokenizer, visual-token counts, prompt rendering;
- `prefix_cache`: the KV block pool with chained block hashes and LRU eviction;
- `sim_output`: the planned output of a request (shape, stop strings);
- `schema_instance`: a small valid instance of a JSON schema.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import math
import random
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from switchyard.capacity.calibration import (
    DEFAULT_SIM_MODEL,
    Precision,
    SimCalibration,
    SimGpu,
    SimModel,
    encoder_seconds,
    prefill_chunk_seconds,
    sim_calibration,
    sim_decode_seconds,
)
from switchyard.capacity.errors import CapacityInputError
from switchyard.capacity.presets import model_preset
from switchyard.config import SectionSettings
from switchyard.engines.base import (
    Capabilities,
    Delta,
    EngineError,
    EngineKind,
    EngineRequest,
    EngineStats,
    ModelInfo,
    SchedulingPolicy,
)
from switchyard.engines.prefix_cache import BlockCache, block_hashes
from switchyard.engines.sim_output import (
    CONSTRAINED_PLACEHOLDER,
    PROMPT_LOOKUP,
    DraftStep,
    SimOutput,
    ngram_steps,
    plan_output,
)
from switchyard.engines.sim_tokens import pseudo_tokens, render_prompt
from switchyard.logging import get_logger
from switchyard.messages.inference import FinishReason, ModelledTimings
from switchyard.vlmgeometry import DEFAULT_VLM, VlmName, vlm_profile

# Re-exported: tests and tools import these from here.
__all__ = [
    "CONSTRAINED_PLACEHOLDER",
    "SimEngine",
    "SimSettings",
    "SimTimings",
    "pseudo_tokens",
]

log = get_logger("switchyard.engines.sim")

# ---------------------------------------------------------------------------
# The A100 calibration (preset `a100`): Qwen2.5-VL-7B, one A100, vLLM.
#
# Reference ([S0] §2.1-2.2, vLLM's published A100 run): at 50 concurrent
# requests TTFT ~58 ms (ViT + prefill) and TPOT 16.36 ms; from 10 to 50
# concurrent TPOT rises only 20 %.
#
# Decode step TPOT(b) = step_overhead + tpot_base + tpot_per_seq * b
#   TPOT(10) = 16.36 / 1.2                  = 13.63 ms
#   tpot_per_seq = (16.36 - 13.63) / 40     = 0.0683 ms per sequence in the step
#   intercept    = 13.63 - 10 * 0.0683      = 12.95 ms
#     = step_overhead 1.0 ms (scheduler, sampler, detokenizer: CPU per step)
#     + tpot_base 11.95 ms (16.6 GB of bf16 weights / 2.04 TB/s = 8.1 ms at
#       peak bandwidth, 68 % achieved)
#   check: TPOT(50) = 1.0 + 11.95 + 50 * 0.0683 = 16.37 ms
#   The benchmark's TPOT averages over steps some of which carried other
#   requests' prefill; it is taken here as the prefill-free step, so the sim's
#   decode is if anything a little slow.
#
# The operating point: 50 sequences decoding, and a typical agent step arriving
# with ~1,300 prompt tokens of which ~1,000 hit the prefix cache (system prompt,
# previous frame, history) and ~300 do not (a new 448x448 frame = 256 visual
# tokens + ~44 tokens of new text), into a step that carries no other prefill
# (the benchmark's requests decode far longer than they prefill).
#   TTFT(50) = queue + alignment + step(50 sequences, 300 prefill tokens)
#   queue     = 0 (50 running < max_num_seqs 64)
#   alignment = half a step on average = 16.37 / 2 = 8.2 ms
#   so the step = 58 - 8.2 = 49.8 ms = TPOT(50) + 300 * prefill_cost_per_token:
#   prefill_cost_per_token = (49.8 - 16.37) / 300 = 0.111 ms -> 0.11 ms
#   check: 0 + 8.2 + 16.37 + 300 * 0.11 = 57.6 ms; that request's own TPOT and
#   the other 49's on steps without prefill: TPOT(50) = 16.37 ms.
#   (0.11 ms/token = 9.1k tokens/s = 16.6 GFLOP/token * 9.1k = 151 TFLOP/s,
#   48 % of the A100's 312 TFLOP/s bf16: a plausible prefill MFU. It is also a
#   ceiling: one A100 prefills ~9,100 uncached tokens per second whatever the
#   batch, which is what bounds agent steps carrying a new frame each.)
#
# kv_capacity_tokens: what an A100 80GB leaves at gpu_memory_utilization 0.9
# after 16.6 GB of weights and 4 GB of activations: 51.4 GB / 28,672 bytes per
# token (28 layers * 4 KV heads * 128 dims * K and V, fp8 as VllmSettings sets
# it) = 1,793,387 tokens. The H100 and RTX 5090 presets scale these figures by
# bandwidth, FLOP/s and memory: `switchyard.capacity.calibration`.
#
# max_num_batched_tokens 8192: what `VllmSettings` (the GPU engine simulated
# here) sets, and vLLM's own default for its OpenAI server on GPUs of 70 GiB or
# more (A100 80GB, H100); on smaller cards (RTX 5090) vLLM would default to 2048,
# which our settings override. With the cost serialised per token, the budget
# moves how prefill spreads over steps (the ITL spikes' height, a long prompt's
# step count), not the prefill work in total. A small budget is Sarathi-Serve's
# stall-free batching (Agrawal et al., OSDI 2024, arXiv 2403.02310): no decoding
# step carries more than that much of another's prefill. It is set per pool, on
# that pool's workers (SY_SIM_MAX_NUM_BATCHED_TOKENS, SY_VLLM_MAX_NUM_BATCHED_TOKENS),
# and `sy agent-sim --search --budgets` measures it. The step cost here is additive
# (decode step + every prefill token), so each extra step a chunked prefill takes
# costs a whole decode step; a roofline, max(compute, weight reads), would charge
# less, so the sim if anything penalises small budgets.
# ---------------------------------------------------------------------------

_A100 = sim_calibration("a100", DEFAULT_SIM_MODEL)
# The SimSettings fields a calibration preset sets.
CALIBRATED = tuple(_A100.settings())


class SimSettings(SectionSettings):
    """The simulator's knobs (env `SY_SIM_...`); durations are seconds.

    `gpu` picks the calibration preset that fills the hardware figures
    (`CALIBRATED`); any of them given explicitly (argument or `SY_SIM_*`) wins.
    """

    model_config = SettingsConfigDict(env_prefix="SY_SIM_")

    gpu: SimGpu = Field(default="a100", description="calibration preset: a100, h100, rtx5090")
    # The model simulated (its shapes set the figures, `capacity.calibration`): the seeds'
    # Qwen3-VL-8B; qwen2.5-vl-7b is the folded model of the A100 anchor ([S0]).
    model: SimModel = Field(default=DEFAULT_SIM_MODEL, description="qwen3-vl-8b, qwen2.5-vl-7b")
    # bf16, or fp8 = W8A8 (FP8 weights and matmuls; refused on a card without FP8: a100).
    precision: Precision = Field(default="bf16", description="bf16 or fp8 (W8A8)")
    max_num_seqs: int = Field(default=64, ge=1, le=4096, description="continuous batching cap")
    max_num_batched_tokens: int = Field(
        default=8192, ge=1, description="tokens per step: 1 per decoding sequence + prefill chunks"
    )
    # The agent pool's steps carry due times (deadline, stale frame): earliest first.
    scheduling_policy: SchedulingPolicy = Field(
        default="priority", description="fcfs or priority (earliest due time first)"
    )
    block_size: int = Field(default=16, ge=1, le=1024, description="tokens per KV block")
    kv_capacity_tokens: int = Field(
        default=_A100.kv_capacity_tokens, ge=1, description="KV cache size in tokens (preset)"
    )
    max_model_len: int = Field(default=32_768, ge=2, description="context window (prompt+output)")
    prefill_cost_per_token: float = Field(
        default=_A100.prefill_cost_per_token, ge=0, description="s per prefilled token (preset)"
    )
    tpot_base: float = Field(
        default=_A100.tpot_base, ge=0, description="s per step, batch-free (preset)"
    )
    tpot_per_seq: float = Field(
        default=_A100.tpot_per_seq, ge=0, description="s per step per sequence (preset)"
    )
    step_overhead: float = Field(
        default=_A100.step_overhead, ge=0, description="fixed s per step (preset)"
    )
    prefill_attn_cost: float = Field(
        default=_A100.prefill_attn_cost, ge=0, description="s per (token, earlier token) (preset)"
    )
    encoder_cost_per_patch: float = Field(
        default=_A100.encoder_cost_per_patch, ge=0, description="s per frame patch (preset)"
    )
    encoder_attn_cost: float = Field(
        default=_A100.encoder_attn_cost, ge=0, description="s per frame patch pair (preset)"
    )
    kv_bytes_per_token: int = Field(
        default=_A100.kv_bytes_per_token, ge=0, description="KV bytes a handoff moves (preset)"
    )
    kv_link_gbs: float = Field(
        default=_A100.kv_link_gbs, gt=0, description="GB/s a KV handoff crosses at (preset)"
    )
    delay_scale: float = Field(default=1.0, ge=0, description="wall s per modelled s; 0 = instant")
    tokens_per_image: int = Field(default=256, ge=1, description="when an image has no size")
    # The VLM simulated (`switchyard.vlmgeometry`; the pool's SY_AGENT_VLM): its visual
    # token size and minimum pixels are the defaults of the next two, and its coordinate
    # convention is how agent answers are written.
    vlm: VlmName = Field(default=DEFAULT_VLM, description="qwen2.5-vl or qwen3-vl")
    image_patch_px: int = Field(default=28, ge=1, description="px per visual token side (vlm)")
    image_min_pixels: int = Field(default=4 * 28 * 28, ge=1, description="small frames up to (vlm)")
    # What `VllmSettings.max_pixels` passes to vLLM, whatever the model.
    image_max_pixels: int = Field(default=1280 * 28 * 28, ge=1)
    # vLLM's n-gram speculative decoding (`VllmSettings.speculative_tokens`, the same names):
    # up to `speculative_tokens` drafted per decode step from a prompt lookup of
    # `prompt_lookup_min`..`prompt_lookup_max` tokens (`sim_output.ngram_steps`). Off by
    # default: measured, it does not pay for agent answers (README, "Agent steps").
    speculative_tokens: int = Field(default=0, ge=0, le=16, description="n-gram drafts; 0 off")
    prompt_lookup_min: int = Field(default=PROMPT_LOOKUP[0], ge=1)
    prompt_lookup_max: int = Field(default=PROMPT_LOOKUP[1], ge=1)
    seed: int = Field(default=0, ge=0)
    active_session_s: float = Field(
        default=30.0, gt=0, description="a session with one step stays active this long"
    )
    timings_history: int = Field(default=4096, ge=0, description="finished requests to remember")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        """Fill the hardware figures not given from the `gpu` preset (before validation,
        so the values given, from arguments or the environment, are the ones kept)."""
        if not isinstance(data, dict):
            return data
        gpu = str(data.get("gpu", "a100")).lower()
        model = str(data.get("model", DEFAULT_SIM_MODEL)).lower()
        precision = str(data.get("precision", "bf16")).lower()
        try:
            figures = sim_calibration(gpu, model, precision).settings()
        except CapacityInputError as e:
            raise ValueError(e.reason) from None
        vlm = vlm_profile(str(data.get("vlm", DEFAULT_VLM)))
        frames = {"image_patch_px": vlm.patch_px, "image_min_pixels": vlm.default_min_pixels}
        return {**figures, **frames, **data, "gpu": gpu, "model": model, "precision": precision}

    @model_validator(mode="after")
    def _budget_fits_the_batch(self) -> SimSettings:
        # vLLM refuses the same: a step must have room for a token of every sequence.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        return self

    def overridden(self) -> list[str]:
        """The hardware figures that differ from the `gpu` preset's."""
        preset = self.preset().settings()
        return [k for k in CALIBRATED if getattr(self, k) != preset[k]]

    def preset(self) -> SimCalibration:
        """The calibration of this engine's GPU, model and precision."""
        return sim_calibration(self.gpu, self.model, self.precision)

    @property
    def calibration(self) -> str:
        """The label of every figure this engine produces: the preset, `+fp8` in that
        precision, `@qwen2.5-vl-7b` for a model other than the default, `+custom` when a
        hardware figure was overridden (`overridden` says which)."""
        label = self.gpu if self.precision == "bf16" else f"{self.gpu}+fp8"
        if self.model != DEFAULT_SIM_MODEL:
            label += f"@{self.model}"
        return f"{label}+custom" if self.overridden() else label

    def calibration_info(self) -> dict[str, object]:
        """The calibration in full (for `/sim/calibration` and logs)."""
        cal = self.preset()
        return {
            "calibration": self.calibration, "gpu": self.gpu, "gpu_name": cal.gpu,
            "model": self.model, "precision": self.precision,
            "figures": {k: getattr(self, k) for k in CALIBRATED},
            "preset_figures": cal.settings(), "overridden": self.overridden(),
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs, "scheduling_policy": self.scheduling_policy,
        }  # fmt: skip


@dataclass(frozen=True)
class SimTimings:
    """What the model says one request cost, in virtual seconds (no wall-clock noise)."""

    request_id: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue: float  # arrival -> admission (slot and KV free)
    # First step boundary after admission -> first token: the steps that carried its
    # prefill chunks (and any it waited through for budget behind earlier prefills).
    prefill: float
    ttft: float | None  # arrival -> first token = queue + alignment + prefill
    tpot: float | None  # (last token - first token) / (tokens - 1)
    total: float  # arrival -> end
    finish_reason: FinishReason
    calibration: str = "a100"  # `SimSettings.calibration` of the engine that ran it
    # The engine time it used: its share of every step it was in (the step's batch-wide
    # part split evenly, its own prefill chunks in full). Summed over a worker's requests
    # it is the GPU's busy time, which waiting behind other prefills is not.
    gpu: float = 0.0
    # KV blocks of active sessions (see the module docstring) its admission evicted.
    evicted_active: int = 0
    # Speculative decoding: tokens drafted for it and accepted of them.
    drafted: int = 0
    accepted: int = 0

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


# ---------------------------------------------------------------------------
# The engine.

_State = Literal["waiting", "prefill", "decode", "done"]


@dataclass(eq=False)
class _Seq:
    request_id: str
    prompt_len: int
    hashes: list[bytes]
    output: SimOutput
    total_blocks: int  # prompt + output, reserved at admission (no preemption)
    arrival: float
    order: tuple[int, int]  # the scheduling policy's key: (priority or 0, arrival number)
    queue: asyncio.Queue[Delta] = field(default_factory=asyncio.Queue)
    state: _State = "waiting"
    admitted: float | None = None
    aligned: float | None = None  # the first step boundary at or after admission
    remaining: int = 0  # prompt tokens still to prefill
    begun: bool = False  # a prefill chunk of it has run (it keeps its place: vLLM's running)
    hit_blocks: int = 0
    pinned: list[bytes] = field(default_factory=list)
    private: int = 0
    cached: int = 0  # prompt tokens served from the prefix cache
    emitted: int = 0
    first_token_at: float | None = None
    gpu: float = 0.0  # its share of the steps it ran in (`SimTimings.gpu`)
    # Its frames as (first token, end, patches), and the vision encoder's time for those
    # not cached, charged to the step that carries its first prefill chunk.
    frames: list[tuple[int, int, int]] = field(default_factory=list)
    encoder: float = 0.0
    # A decode stage (#39): its prompt's KV is moved from the prefill worker, not computed;
    # it joins the steps when the move is done (virtual time), its last token to compute.
    handoff: bool = False
    loaded_at: float | None = None
    # A prefill stage (#39): its KV stays held here, past its end, while the decode
    # worker pulls it (`SimEngine._held`).
    kv_producer: bool = False

    session: str | None = None  # tenant and session, the owner of the blocks it holds
    evicted_active: int = 0  # `SimTimings.evicted_active`
    spec: tuple[DraftStep, ...] = ()  # its decode steps under speculation (none: 1 token each)
    steps: int = 0  # steps that emitted tokens
    drafted: int = 0
    accepted: int = 0

    def draft(self) -> int:
        """Tokens drafted for its next decode step (each is verified, like a prefill token)."""
        return self.spec[self.steps - 1].drafted if 0 < self.steps <= len(self.spec) else 0


def _order(seq: _Seq) -> tuple[int, int]:
    return seq.order


class SimEngine:
    """A simulator of one vLLM GPU engine (kind ``"sim"``); see the module docstring."""

    kind: EngineKind = "sim"

    def __init__(self, settings: SimSettings | None = None) -> None:
        self.settings = s = settings or SimSettings()
        self.capabilities = Capabilities(
            vision=True,
            json_schema=True,
            grammar=True,
            regex=True,
            lora=True,
            max_context=s.max_model_len,
        )
        self._calibration = s.calibration  # settings are fixed for an engine's life
        vision = model_preset(s.model).vision
        self._merge = vision.spatial_merge**2 if vision is not None else 4  # patches per token
        self._cache = BlockCache(max(1, s.kv_capacity_tokens // s.block_size), self._active)
        # Session -> (its last step's arrival, the interval before it), by last arrival;
        # and how many of its requests are in the engine (see "Active sessions").
        self._sessions: OrderedDict[str, tuple[float, float | None]] = OrderedDict()
        self._in_engine: Counter[str] = Counter()
        self._seqs: dict[str, _Seq] = {}  # in flight, by request id
        self._waiting: list[_Seq] = []  # by `_Seq.order`
        self._arrivals = 0
        self._running: list[_Seq] = []  # prefill and decode, in admission order
        self._timings: OrderedDict[str, SimTimings] = OrderedDict()
        self._queried = 0
        self._hits = 0
        # Virtual clock, and the wall-clock anchor that maps it when delay_scale > 0.
        self._now = 0.0
        self._step: tuple[float, float] | None = None  # (start, end) of the step under way
        # Finished prefill stages' KV, held for the decode worker to pull until (virtual)
        # the first element: vLLM's connectors free a producer's blocks only once the
        # consumer has read them, so the handoff's KV counts on both workers meanwhile.
        self._held: list[tuple[float, list[bytes], int]] = []
        self._anchor = (0.0, time.monotonic())
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # -- Engine protocol ----------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            return
        self._closed = False
        self._wake = asyncio.Event()  # bound to the loop that runs the scheduler
        self._anchor = (self._now, time.monotonic())
        self._task = asyncio.create_task(self._run(), name="sim-engine-scheduler")
        s = self.settings
        log.info(
            "sim engine started (a simulator, not a model)",
            engine="sim",
            max_num_seqs=s.max_num_seqs,
            kv_blocks=self._cache.num_blocks,
            delay_scale=s.delay_scale,
            calibration=self._calibration,
        )

    async def generate(self, request: EngineRequest) -> AsyncGenerator[Delta, None]:
        seq = self._submit(request)
        try:
            while True:
                delta = await seq.queue.get()
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            if seq.state != "done":  # the consumer went away: free its slot like vLLM
                self._finish(seq, "abort")

    async def abort(self, request_id: str) -> None:
        seq = self._seqs.get(request_id)
        if seq is not None:
            self._finish(seq, "abort")

    def stats(self) -> EngineStats:
        return EngineStats(
            kv_cache_usage=self._cache.used / self._cache.num_blocks,
            kv_capacity_tokens=self._cache.num_blocks * self.settings.block_size,
            waiting=len(self._waiting),
            running=len(self._running),
            prefix_queried_tokens=self._queried,
            prefix_hit_tokens=self._hits,
            # The sim reserves a request's KV blocks at admission, so it never preempts
            # one (vLLM does, when blocks run out): its count is 0, not unknown.
            preemptions=0,
        )

    async def close(self) -> None:
        self._closed = True
        for seq in list(self._seqs.values()):
            self._finish(seq, "abort")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        log.info("sim engine closed", engine="sim", evicted_blocks=self._cache.evicted,
                 evicted_active_blocks=self._cache.evicted_active)  # fmt: skip

    # -- modelled numbers -----------------------------------------------------

    @property
    def evicted_active_blocks(self) -> int:
        """KV blocks of active sessions evicted so far (see "Active sessions")."""
        return self._cache.evicted_active

    def _active(self, session: str) -> bool:
        """Whether `session` is active now (the module docstring's "Active sessions")."""
        if self._in_engine[session] > 0:
            return True
        seen = self._sessions.get(session)
        if seen is None:
            return False
        last, interval = seen
        window = 2 * interval if interval is not None else self.settings.active_session_s
        return self._now - last <= window

    def _arrived(self, session: str, at: float) -> None:
        last = self._sessions.pop(session, None)
        self._sessions[session] = (at, at - last[0] if last is not None else None)
        self._in_engine[session] += 1
        while self._sessions:  # forget sessions that went inactive, oldest first
            oldest = next(iter(self._sessions))
            if self._active(oldest):
                break
            del self._sessions[oldest]
            self._in_engine.pop(oldest, None)

    @property
    def slots(self) -> int:
        """The batch cap: sequences run at once."""
        return self.settings.max_num_seqs

    @property
    def calibration(self) -> str:
        """What every figure of this engine is modelled at (`SimSettings.calibration`)."""
        return self._calibration

    @property
    def model(self) -> ModelInfo:
        """The model simulated; its version is the calibration it is simulated at."""
        return ModelInfo(self.settings.model, f"sim-{self._calibration}")

    def tpot(self, batch: int) -> float:
        """Modelled duration of one decode step (no prefill) with `batch` sequences."""
        return sim_decode_seconds(self.settings, batch)

    def step_time(self, batch: int, prefill_tokens: int) -> float:
        """Modelled duration of one step of `batch` sequences carrying `prefill_tokens`
        (their per-token cost only: `_chunk_cost` adds attention and the encoder)."""
        return self.tpot(batch) + prefill_tokens * self.settings.prefill_cost_per_token

    def _chunk_cost(self, seq: _Seq, tokens: int) -> float:
        """GPU time of a prefill chunk of `seq`: the LLM's over its positions, plus the
        encoder for its uncached frames when it is the sequence's first chunk."""
        start = seq.prompt_len - seq.remaining
        return prefill_chunk_seconds(self.settings, start, tokens) + seq.encoder

    def timings(self, request_id: str) -> SimTimings | None:
        """Modelled timings of a finished request (the last `timings_history` are kept)."""
        return self._timings.get(request_id)

    def modelled_timings(self, request_id: str) -> ModelledTimings | None:
        """`timings` as a result carries them (`ModelsCost`)."""
        t = self._timings.get(request_id)
        if t is None:
            return None
        return ModelledTimings(
            queue=t.queue, prefill=t.prefill,
            decode=max(0.0, t.total - t.queue - t.prefill), total=t.total, ttft=t.ttft,
            calibration=t.calibration, gpu=t.gpu, evicted_active=t.evicted_active,
        )  # fmt: skip

    @property
    def clock(self) -> float:
        """The virtual time in seconds since the engine was created."""
        return self._now

    def prompt_tokens(self, request: EngineRequest) -> list[str]:
        """The pseudo-tokens the simulator prefills for `request` (for tests and tools)."""
        return render_prompt(request, self.settings)

    # -- admission ------------------------------------------------------------

    def _submit(self, request: EngineRequest) -> _Seq:
        if self._task is None or self._closed:
            raise EngineError("the sim engine is not started", code="engine_error")
        rid = request.request_id
        if rid in self._seqs:
            raise EngineError(f"request {rid} is already running", code="invalid_request")
        s = self.settings
        tokens = render_prompt(request, s)
        max_tokens = request.sampling.max_tokens
        if len(tokens) + max_tokens > s.max_model_len:
            raise EngineError(
                f"prompt ({len(tokens)} tokens) + max_tokens ({max_tokens}) exceeds the "
                f"context window of {s.max_model_len}",
                code="context_length",
            )
        output = plan_output(request, self._rng_for(request, tokens), vlm_profile(s.vlm).coords)
        spec: tuple[DraftStep, ...] = ()
        if s.speculative_tokens:
            lookup = (s.speculative_tokens, s.prompt_lookup_min, s.prompt_lookup_max)
            spec = ngram_steps(tokens, output.pieces, *lookup)
        total_blocks = -(-(len(tokens) + len(output.pieces)) // s.block_size)
        if total_blocks > self._cache.num_blocks:
            raise EngineError(
                f"request needs {total_blocks} KV blocks, the cache holds {self._cache.num_blocks}",
                code="context_length",
            )
        seq = _Seq(
            request_id=rid,
            prompt_len=len(tokens),
            hashes=block_hashes(tokens, s.block_size, salt=request.cache_salt, lora=request.lora),
            output=output,
            total_blocks=total_blocks,
            arrival=self._arrival_time(),
            frames=self._frames(tokens),
            order=(request.priority if s.scheduling_policy == "priority" else 0, self._arrivals),
            session=f"{request.tenant}\x1e{request.session}" if request.session else None,
            spec=spec,
            handoff=request.handoff is not None,
            kv_producer=request.kv_producer,
        )
        self._arrivals += 1
        if seq.session is not None:
            self._arrived(seq.session, seq.arrival)
        if not self._running and self._step is None:
            self._now = max(self._now, seq.arrival)  # an idle engine starts now
        self._seqs[rid] = seq
        bisect.insort(self._waiting, seq, key=_order)
        self._admit(seq.arrival)
        self._wake.set()
        return seq

    def _frames(self, tokens: Sequence[str]) -> list[tuple[int, int, int]]:
        """The frames in a rendered prompt: (first visual token, end, patches)."""
        frames, start = [], -1
        for i, tok in enumerate(tokens):
            if tok == "<|vision_start|>":
                start = i + 1
            elif tok == "<|vision_end|>" and start >= 0:
                frames.append((start, i, (i - start) * self._merge))
                start = -1
        return frames

    def _rng_for(self, request: EngineRequest, tokens: Sequence[str]) -> random.Random:
        # Greedy decoding depends on the prompt only; sampling also on its seed
        # (or on the request id when unseeded, so repeats differ).
        sp = request.sampling
        salt = (
            ""
            if sp.temperature == 0
            else str(sp.seed if sp.seed is not None else request.request_id)
        )
        digest = hashlib.blake2b(
            f"{self.settings.seed}\x1e{salt}\x1e".encode() + "\x1f".join(tokens).encode(),
            digest_size=8,
        ).digest()
        return random.Random(int.from_bytes(digest, "big"))

    def _admit(self, now: float) -> None:
        """Admit waiting requests in policy order while a slot and their KV blocks are free."""
        s = self.settings
        while self._waiting and len(self._running) < s.max_num_seqs:
            seq = self._waiting[0]
            # vLLM always computes the last prompt token, so at most (n-1)//bs blocks hit.
            hits = seq.hashes[
                : self._cache.match(seq.hashes[: (seq.prompt_len - 1) // s.block_size])
            ]
            new_blocks = seq.total_blocks - len(hits)
            if not self._cache.can_acquire(hits, new_blocks):
                return
            self._waiting.pop(0)
            before = self._cache.evicted_active
            self._cache.acquire(hits, new_blocks, seq.session)
            seq.evicted_active = self._cache.evicted_active - before
            seq.pinned, seq.private, seq.hit_blocks = list(hits), new_blocks, len(hits)
            seq.cached = len(hits) * s.block_size
            self._queried += seq.prompt_len
            self._hits += seq.cached
            seq.state, seq.admitted = "prefill", now
            # Admitted during a step: its first chunk rides the next one.
            step_end = self._step[1] if self._step is not None else now
            seq.aligned = max(now, step_end)
            seq.remaining = max(1, seq.prompt_len - seq.cached)
            # vLLM runs the encoder for an image any of whose tokens must be computed.
            seq.encoder = sum(
                encoder_seconds(s, patches) for _, end, patches in seq.frames if end > seq.cached
            )
            if seq.handoff:  # what this engine does not hold crosses the link, then one token
                moved = (seq.prompt_len - seq.cached) * s.kv_bytes_per_token
                seq.loaded_at = seq.aligned + moved / (s.kv_link_gbs * 1e9)
                seq.remaining, seq.encoder = 1, 0.0
            self._running.append(seq)

    # -- the scheduler --------------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                await self._tick()
        except Exception:
            # A bug here must not leave callers waiting forever on their streams.
            log.exception("sim engine scheduler failed", engine="sim")
            self._closed = True
            for seq in list(self._seqs.values()):
                self._finish(seq, "error")
            raise

    async def _tick(self) -> None:
        """One scheduler turn: admit, then run one step, or wait for work."""
        self._free_pulled(self._now)
        self._admit(self._now)
        decoding, chunks = self._plan()
        if decoding or chunks:
            await self._run_step(decoding, chunks)
            return
        moving = [q.loaded_at for q in self._running if self._moving(q) and q.loaded_at]
        if self._waiting:  # a request waiting for room: held KV frees some when pulled
            moving += [until for until, _, _ in self._held]
        if moving:  # idle but for KV on its way: the engine waits for the first to land
            await self._sleep_until(min(moving))
            self._now = max(self._now, min(moving))
        else:
            self._wake.clear()
            await self._wake.wait()

    def _free_pulled(self, now: float) -> None:
        """Release the held KV of prefill stages whose decode worker has pulled it."""
        done = [h for h in self._held if h[0] <= now]
        for _, pinned, private in done:
            self._cache.release(pinned, private)
        self._held = [h for h in self._held if h[0] > now]

    def _moving(self, seq: _Seq) -> bool:
        """A decode stage whose KV is still crossing the link."""
        return seq.loaded_at is not None and seq.loaded_at > self._now

    def _plan(self) -> tuple[list[_Seq], list[tuple[_Seq, int]]]:
        """The next step: every decoding sequence, then prefill chunks within what is left
        of the token budget (the last one cut to fit): the begun prompts in admission
        order, then the others in policy order (the module docstring)."""
        decoding = [q for q in self._running if q.state == "decode"]
        budget = self.settings.max_num_batched_tokens - sum(1 + q.draft() for q in decoding)
        chunks: list[tuple[_Seq, int]] = []
        prefilling = [q for q in self._running if q.state == "prefill" and not self._moving(q)]
        # Stable: the begun keep the running order, the rest sort by the policy's key.
        prefilling.sort(key=lambda q: (0, 0, 0) if q.begun else (1, *q.order))
        for q in prefilling:
            if budget <= 0:
                break
            take = min(q.remaining, budget)
            chunks.append((q, take))
            budget -= take
        return decoding, chunks

    async def _run_step(self, decoding: list[_Seq], chunks: list[tuple[_Seq, int]]) -> None:
        start = self._now
        costs = [self._chunk_cost(seq, n) for seq, n in chunks]
        # Drafted tokens are verified in the step's forward pass: compute, like prefill.
        verify = sum(q.draft() for q in decoding) * self.settings.prefill_cost_per_token
        end = start + self.tpot(len(decoding) + len(chunks)) + sum(costs) + verify
        self._step = (start, end)
        try:
            await self._sleep_until(end)
        finally:
            self._step = None
        self._now = end
        # The step's engine time, shared out: its batch-wide part evenly over the
        # sequences in it, each prefill chunk's part to its own sequence.
        shared = self.tpot(len(decoding) + len(chunks)) / (len(decoding) + len(chunks))
        for seq in decoding:
            seq.gpu += shared + seq.draft() * self.settings.prefill_cost_per_token
        for (seq, _), cost in zip(chunks, costs, strict=True):
            seq.gpu += shared + cost
            seq.encoder = 0.0  # charged once
        for seq in decoding:
            if seq.state == "decode":  # not aborted during the step
                self._emit(seq)
        for seq, n in chunks:
            if seq.state != "prefill":
                continue
            seq.remaining -= n
            seq.begun = True
            if seq.remaining == 0:  # the step that computes the last chunk samples a token
                self._prefilled(seq)
                self._emit(seq)

    async def _sleep_until(self, target: float) -> None:
        """Sleep (scaled) until virtual `target`."""
        scale = self.settings.delay_scale
        if scale == 0:
            await asyncio.sleep(0)  # yield: producers and consumers run between steps
            return
        v0, w0 = self._anchor
        delay = w0 + (target - v0) * scale - time.monotonic()
        if delay <= 0:
            if delay < -0.25:  # far behind (a loaded CPU): drift rather than burst
                self._anchor = (target, time.monotonic())
            await asyncio.sleep(0)
            return
        await asyncio.sleep(delay)

    def _arrival_time(self) -> float:
        """Virtual time of an arrival now: inside the step under way, or now when idle."""
        lo, hi = self._step if self._step is not None else (self._now, math.inf)
        scale = self.settings.delay_scale
        if scale == 0:
            return hi if self._step is not None else lo  # arrivals land on step boundaries
        v0, w0 = self._anchor
        return min(max(v0 + (time.monotonic() - w0) / scale, lo), hi)

    # -- sequence lifecycle ---------------------------------------------------

    def _prefilled(self, seq: _Seq) -> None:
        full = seq.prompt_len // self.settings.block_size
        computed = seq.hashes[seq.hit_blocks : full]
        seq.private -= self._cache.commit(computed, seq.session)
        seq.pinned.extend(computed)
        seq.state = "decode"

    def _emit(self, seq: _Seq) -> None:
        """The tokens of its step: one, or under speculation the accepted drafts and one."""
        pieces = seq.output.pieces
        n = 1
        if 0 < seq.steps <= len(seq.spec):
            step = seq.spec[seq.steps - 1]
            n, seq.drafted, seq.accepted = (
                step.emitted,
                seq.drafted + step.drafted,
                seq.accepted + step.accepted,
            )
        seq.steps += 1
        text = "".join(pieces[seq.emitted : seq.emitted + n])
        seq.emitted += n
        queued = None
        if seq.first_token_at is None:
            seq.first_token_at = self._now
            admitted = seq.arrival if seq.admitted is None else seq.admitted
            queued = (admitted - seq.arrival) * self.settings.delay_scale  # wall seconds
        last = seq.emitted == len(pieces)
        seq.queue.put_nowait(
            Delta(
                text=text,
                completion_tokens=seq.emitted,
                prompt_tokens=seq.prompt_len,
                cached_tokens=seq.cached,
                finish_reason=seq.output.finish if last else None,
                queued=queued,
            )
        )
        if last:
            self._finish(seq, seq.output.finish, notify=False)

    def _finish(self, seq: _Seq, reason: FinishReason, *, notify: bool = True) -> None:
        if seq.state == "done":
            return
        if seq.state == "waiting":
            self._waiting.remove(seq)
        else:
            self._running.remove(seq)
            if seq.kv_producer and reason in ("length", "stop"):
                # Held until the decode worker has pulled it: the whole prompt over the
                # link at most (it moves what its own cache lacks).
                moved = seq.prompt_len * self.settings.kv_bytes_per_token
                until = self._now + moved / (self.settings.kv_link_gbs * 1e9)
                self._held.append((until, seq.pinned, seq.private))
            else:
                self._cache.release(seq.pinned, seq.private)
        seq.state = "done"
        self._seqs.pop(seq.request_id, None)
        if seq.session is not None and self._in_engine[seq.session] > 0:
            self._in_engine[seq.session] -= 1
        if notify:
            seq.queue.put_nowait(
                Delta(
                    text="",
                    completion_tokens=seq.emitted,
                    prompt_tokens=seq.prompt_len,
                    cached_tokens=seq.cached,
                    finish_reason=reason,
                )
            )
        self._record(seq, reason)
        self._wake.set()  # freed capacity: waiting requests may fit now

    def _record(self, seq: _Seq, reason: FinishReason) -> None:
        keep = self.settings.timings_history
        if keep == 0:
            return
        end = self._now
        admitted = end if seq.admitted is None else seq.admitted
        first = seq.first_token_at
        prefill = 0.0
        if seq.aligned is not None:
            prefill = max(0.0, (end if first is None else first) - seq.aligned)
        self._timings[seq.request_id] = SimTimings(
            request_id=seq.request_id,
            prompt_tokens=seq.prompt_len,
            cached_tokens=seq.cached,
            completion_tokens=seq.emitted,
            queue=max(0.0, admitted - seq.arrival),
            prefill=prefill,
            ttft=None if first is None else first - seq.arrival,
            tpot=None if first is None or seq.emitted < 2 else (end - first) / (seq.emitted - 1),
            total=end - seq.arrival,
            finish_reason=reason,
            calibration=self._calibration,
            gpu=seq.gpu,
            evicted_active=seq.evicted_active,
            drafted=seq.drafted,
            accepted=seq.accepted,
        )
        while len(self._timings) > keep:
            self._timings.popitem(last=False)
