"""A simulator of ONE vLLM GPU engine, for router and load work on CPU.

`SimEngine` (kind ``"sim"``) is a simulator, not a model: it produces no
meaningful text. It reproduces what a router and a load test can observe of a
vLLM engine: continuous batching up to `max_num_seqs`, a paged KV cache of
16-token blocks with prefix caching (chained block hashes, cache salt, LRU
eviction), TTFT that grows with uncached prompt tokens, TPOT that grows with the
batch, and outputs of the requested shape (exactly `max_tokens`, or a JSON
instance of the requested schema).

Time model (virtual seconds; the wall clock follows it times `delay_scale`):

- TPOT(batch) = step_overhead + tpot_base + tpot_per_seq * batch, where batch
  counts every running sequence (prefilling ones share the forward pass).
- A request is admitted when a slot and its KV blocks are free (FCFS), then
  prefills for uncached_tokens * prefill_cost_per_token, then joins the decode
  batch at the next step boundary and emits one token per step. So
  TTFT = queue wait + prefill + alignment to a step boundary + one decode step.
- Prefill does not lengthen other sequences' decode steps (the calibration
  point below was measured with that interference folded into the TPOT slope).

Every request's modelled timings are kept (see `SimEngine.timings`) so tests
and load tools can read exact, noise-free numbers instead of wall-clock ones.

This module holds the engine, its settings and its timing record; the parts it
is built from live beside it:

- `sim_tokens`: the pseudo-tokenizer, visual-token counts, prompt rendering;
- `prefix_cache`: the KV block pool with chained block hashes and LRU eviction;
- `sim_output`: the planned output of a request (shape, stop strings);
- `schema_instance`: a small valid instance of a JSON schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import random
import time
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from switchyard.config import SectionSettings
from switchyard.engines.base import (
    Capabilities,
    Delta,
    EngineError,
    EngineKind,
    EngineRequest,
    EngineStats,
)
from switchyard.engines.prefix_cache import BlockCache, block_hashes
from switchyard.engines.sim_output import CONSTRAINED_PLACEHOLDER, SimOutput, plan_output
from switchyard.engines.sim_tokens import pseudo_tokens, render_prompt
from switchyard.logging import get_logger
from switchyard.messages.inference import FinishReason, ModelledTimings

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
# Calibration of the defaults: Qwen2.5-VL-7B-class model, one A100, vLLM.
#
# Reference ([S0] §2.1-2.2, vLLM's published A100 run): at 50 concurrent
# requests TTFT ~58 ms (ViT + prefill) and TPOT 16.36 ms; from 10 to 50
# concurrent TPOT rises only 20 %.
#
# TPOT(b) = step_overhead + tpot_base + tpot_per_seq * b
#   TPOT(10) = 16.36 / 1.2                  = 13.63 ms
#   tpot_per_seq = (16.36 - 13.63) / 40     = 0.0683 ms per running sequence
#   intercept    = 13.63 - 10 * 0.0683      = 12.95 ms
#     = step_overhead 1.0 ms (scheduler, sampler, detokenizer: CPU per step)
#     + tpot_base 11.95 ms (16.6 GB of bf16 weights / 2.0 TB/s = 8.3 ms at
#       peak bandwidth, ~70 % achieved)
#   check: TPOT(50) = 1.0 + 11.95 + 50 * 0.0683 = 16.37 ms
#
# TTFT(50) = queue + prefill + alignment + TPOT(50)
#   queue     = 0 (50 running < max_num_seqs 64)
#   alignment = half a step on average = 16.37 / 2 = 8.2 ms
#   so prefill = 58 - 8.2 - 16.37 = 33.4 ms for a typical agent step:
#   ~1,300 prompt tokens of which ~1,000 hit the prefix cache (system prompt,
#   previous frame, history) and ~300 do not (a new 448x448 frame = 256 visual
#   tokens + ~44 tokens of new text)
#   prefill_cost_per_token = 33.4 ms / 300 = 0.111 ms -> 0.11 ms
#   check: 0 + 300 * 0.11 + 8.2 + 16.37 = 57.6 ms
#   (0.11 ms/token = 9.1k tokens/s = 15.2 GFLOP/token * 9.1k = 138 TFLOP/s,
#   44 % of the A100's 312 TFLOP/s bf16: a plausible prefill MFU.)
#
# kv_capacity_tokens 200,000: the LM keeps 28 layers * 4 KV heads * 128 dims
# * 2 (K, V) = 28,672 values per token = 57 KB bf16 / 28 KB fp8; 200k tokens =
# 11.5 GB bf16 or 5.7 GB fp8 - what an A100-40GB (40 * 0.9 - 16.6 GB weights -
# ~4 GB activations = ~15 GB) or a 32 GB RTX 5090 leaves for KV.
# ---------------------------------------------------------------------------


class SimSettings(SectionSettings):
    """The simulator's knobs (env `SY_SIM_...`); durations are seconds."""

    model_config = SettingsConfigDict(env_prefix="SY_SIM_")

    max_num_seqs: int = Field(default=64, ge=1, le=4096, description="continuous batching cap")
    block_size: int = Field(default=16, ge=1, le=1024, description="tokens per KV block")
    kv_capacity_tokens: int = Field(default=200_000, ge=1, description="KV cache size in tokens")
    max_model_len: int = Field(default=32_768, ge=2, description="context window (prompt+output)")
    prefill_cost_per_token: float = Field(
        default=0.000_11, ge=0, description="s per uncached token"
    )
    tpot_base: float = Field(default=0.011_95, ge=0, description="s per decode step, batch-free")
    tpot_per_seq: float = Field(default=0.000_068_3, ge=0, description="s per step per sequence")
    step_overhead: float = Field(default=0.001, ge=0, description="fixed s per decode step")
    delay_scale: float = Field(default=1.0, ge=0, description="wall s per modelled s; 0 = instant")
    tokens_per_image: int = Field(default=256, ge=1, description="when an image has no size")
    image_patch_px: int = Field(default=28, ge=1, description="px per visual token side (Qwen-VL)")
    image_min_pixels: int = Field(default=4 * 28 * 28, ge=1)
    image_max_pixels: int = Field(default=1280 * 28 * 28, ge=1)
    seed: int = Field(default=0, ge=0)
    timings_history: int = Field(default=4096, ge=0, description="finished requests to remember")


@dataclass(frozen=True)
class SimTimings:
    """What the model says one request cost, in virtual seconds (no wall-clock noise)."""

    request_id: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue: float  # arrival -> admission (slot and KV free)
    prefill: float  # uncached tokens * prefill_cost_per_token
    ttft: float | None  # arrival -> first token
    tpot: float | None  # (last token - first token) / (tokens - 1)
    total: float  # arrival -> end
    finish_reason: FinishReason

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
    queue: asyncio.Queue[Delta] = field(default_factory=asyncio.Queue)
    state: _State = "waiting"
    admitted: float | None = None
    ready: float = 0.0  # prefill finished
    hit_blocks: int = 0
    pinned: list[bytes] = field(default_factory=list)
    private: int = 0
    cached: int = 0  # prompt tokens served from the prefix cache
    emitted: int = 0
    first_token_at: float | None = None


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
        self._cache = BlockCache(max(1, s.kv_capacity_tokens // s.block_size))
        self._seqs: dict[str, _Seq] = {}  # in flight, by request id
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []  # prefill and decode, in admission order
        self._timings: OrderedDict[str, SimTimings] = OrderedDict()
        self._queried = 0
        self._hits = 0
        # Virtual clock, and the wall-clock anchor that maps it when delay_scale > 0.
        self._now = 0.0
        self._step: tuple[float, float] | None = None  # (start, end) of the step under way
        self._horizon = math.inf  # the prefill wait under way ends here
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
            waiting=len(self._waiting),
            running=len(self._running),
            prefix_queried_tokens=self._queried,
            prefix_hit_tokens=self._hits,
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
        log.info("sim engine closed", engine="sim", evicted_blocks=self._cache.evicted)

    # -- modelled numbers -----------------------------------------------------

    @property
    def slots(self) -> int:
        """The batch cap: sequences run at once."""
        return self.settings.max_num_seqs

    def tpot(self, batch: int) -> float:
        """Modelled duration of one decode step with `batch` running sequences."""
        s = self.settings
        return s.step_overhead + s.tpot_base + s.tpot_per_seq * batch

    def prefill_time(self, uncached_tokens: int) -> float:
        return max(1, uncached_tokens) * self.settings.prefill_cost_per_token

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
        output = plan_output(request, self._rng_for(request, tokens))
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
        )
        if not self._running and self._step is None:
            self._now = max(self._now, seq.arrival)  # an idle engine starts now
        self._seqs[rid] = seq
        self._waiting.append(seq)
        self._admit(seq.arrival)
        self._wake.set()
        return seq

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
        """Admit waiting requests FCFS while a slot and their KV blocks are free."""
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
            self._waiting.popleft()
            self._cache.acquire(hits, new_blocks)
            seq.pinned, seq.private, seq.hit_blocks = list(hits), new_blocks, len(hits)
            seq.cached = len(hits) * s.block_size
            self._queried += seq.prompt_len
            self._hits += seq.cached
            seq.state, seq.admitted = "prefill", now
            seq.ready = now + self.prefill_time(seq.prompt_len - seq.cached)
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
        """One scheduler turn: admit, join finished prefills, then step or wait."""
        self._admit(self._now)
        for seq in self._running:
            if seq.state == "prefill" and seq.ready <= self._now:
                self._prefilled(seq)
        decoding = [q for q in self._running if q.state == "decode"]
        if decoding:
            await self._decode_step(decoding)
        elif self._running:
            await self._wait_prefill(min(q.ready for q in self._running))
        else:
            self._wake.clear()
            await self._wake.wait()

    async def _decode_step(self, decoding: list[_Seq]) -> None:
        start = self._now
        end = start + self.tpot(len(self._running))
        self._step = (start, end)
        try:
            await self._sleep_until(end)
        finally:
            self._step = None
        self._now = end
        for seq in decoding:
            if seq.state == "decode":  # not aborted during the step
                self._emit(seq)

    async def _wait_prefill(self, until: float) -> None:
        """Sleep until the next prefill finishes; an arrival cuts the wait short."""
        self._horizon = until
        self._wake.clear()
        try:
            woken = await self._sleep_until(until, wake=True)
        finally:
            self._horizon = math.inf
        self._now = max(self._now, min(until, self._arrival_time())) if woken else until

    async def _sleep_until(self, target: float, *, wake: bool = False) -> bool:
        """Sleep (scaled) until virtual `target`; True if `wake` was set first."""
        scale = self.settings.delay_scale
        if scale == 0:
            await asyncio.sleep(0)  # yield: producers and consumers run between steps
            return wake and self._wake.is_set()
        v0, w0 = self._anchor
        delay = w0 + (target - v0) * scale - time.monotonic()
        if delay <= 0:
            if delay < -0.25:  # far behind (a loaded CPU): drift rather than burst
                self._anchor = (target, time.monotonic())
            await asyncio.sleep(0)
            return wake and self._wake.is_set()
        if not wake:
            await asyncio.sleep(delay)
            return False
        try:
            await asyncio.wait_for(self._wake.wait(), delay)
        except TimeoutError:
            return False
        return True

    def _arrival_time(self) -> float:
        """Virtual time of an arrival now: inside the step (or wait) under way."""
        lo, hi = self._step if self._step is not None else (self._now, self._horizon)
        scale = self.settings.delay_scale
        if scale == 0:
            return hi if self._step is not None else lo  # arrivals land on step boundaries
        v0, w0 = self._anchor
        return min(max(v0 + (time.monotonic() - w0) / scale, lo), hi)

    # -- sequence lifecycle ---------------------------------------------------

    def _prefilled(self, seq: _Seq) -> None:
        full = seq.prompt_len // self.settings.block_size
        computed = seq.hashes[seq.hit_blocks : full]
        seq.private -= self._cache.commit(computed)
        seq.pinned.extend(computed)
        seq.state = "decode"

    def _emit(self, seq: _Seq) -> None:
        pieces = seq.output.pieces
        text = pieces[seq.emitted]
        seq.emitted += 1
        if seq.first_token_at is None:
            seq.first_token_at = self._now
        last = seq.emitted == len(pieces)
        seq.queue.put_nowait(
            Delta(
                text=text,
                completion_tokens=seq.emitted,
                prompt_tokens=seq.prompt_len,
                cached_tokens=seq.cached,
                finish_reason=seq.output.finish if last else None,
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
            self._cache.release(seq.pinned, seq.private)
        seq.state = "done"
        self._seqs.pop(seq.request_id, None)
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
        self._timings[seq.request_id] = SimTimings(
            request_id=seq.request_id,
            prompt_tokens=seq.prompt_len,
            cached_tokens=seq.cached,
            completion_tokens=seq.emitted,
            queue=max(0.0, admitted - seq.arrival),
            prefill=0.0 if seq.admitted is None else self.prefill_time(seq.prompt_len - seq.cached),
            ttft=None if first is None else first - seq.arrival,
            tpot=None if first is None or seq.emitted < 2 else (end - first) / (seq.emitted - 1),
            total=end - seq.arrival,
            finish_reason=reason,
        )
        while len(self._timings) > keep:
            self._timings.popitem(last=False)
