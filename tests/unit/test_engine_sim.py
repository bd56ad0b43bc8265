"""The vLLM simulator: prefix cache, KV pressure, timing model, outputs, abort, salts.

Timings are read from the simulator's own modelled numbers (`SimEngine.timings`),
so these tests do not depend on wall-clock noise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from pydantic import BaseModel, Field, StringConstraints, TypeAdapter

from switchyard.capacity.calibration import encoder_seconds, prefill_chunk_seconds
from switchyard.engines.base import Delta, Engine, EngineError, EngineRequest, ModelsCost
from switchyard.engines.prefix_cache import BlockCache
from switchyard.engines.sim import (
    CALIBRATED,
    CONSTRAINED_PLACEHOLDER,
    SimEngine,
    SimSettings,
    pseudo_tokens,
)
from switchyard.messages.agent import Action
from switchyard.messages.inference import (
    ChatMessage,
    ChoiceConstraint,
    Constraint,
    GrammarConstraint,
    Image,
    ImagePart,
    JsonObjectConstraint,
    JsonSchemaConstraint,
    KvHandoff,
    NoConstraint,
    RegexConstraint,
    Sampling,
    TextPart,
)

SYSTEM = "You are a game agent. Look at the screen and answer with one action. " * 20


@asynccontextmanager
async def sim(**overrides: Any) -> AsyncIterator[SimEngine]:
    # The scheduler's arithmetic is checked on the folded anchor model, whose prefill is
    # linear in tokens; Qwen3-VL-8B's attention and encoder terms have tests of their own.
    settings = SimSettings(**{"delay_scale": 0.0, "model": "qwen2.5-vl-7b", **overrides})
    engine = SimEngine(settings)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


def frame(n: int, width: int = 448, height: int = 448) -> Image:
    return Image(
        hash=hashlib.sha256(f"frame-{n}".encode()).hexdigest()[:32],
        data=b"\x89PNG",
        mime="image/png",
        width=width,
        height=height,
    )


def step(
    rid: str,
    frames: Sequence[Image],
    text: str,
    *,
    salt: str | None = None,
    lora: str | None = None,
    max_tokens: int = 16,
    constraint: Constraint | None = None,
) -> EngineRequest:
    parts: list[TextPart | ImagePart] = [ImagePart(hash=f.hash) for f in frames]
    parts.append(TextPart(text=text))
    return EngineRequest(
        request_id=rid,
        messages=(
            ChatMessage(role="system", content=SYSTEM),
            ChatMessage(role="user", content=parts),
        ),
        images=tuple(frames),
        sampling=Sampling(max_tokens=max_tokens),
        constraint=constraint or NoConstraint(),
        cache_salt=salt,
        lora=lora,
    )


def text_request(rid: str, text: str, max_tokens: int = 16, **kw: Any) -> EngineRequest:
    return EngineRequest(
        request_id=rid, prompt=text, sampling=Sampling(max_tokens=max_tokens, **kw)
    )


async def run(engine: SimEngine, request: EngineRequest) -> list[Delta]:
    return [d async for d in engine.generate(request)]


async def cached(engine: SimEngine, request: EngineRequest) -> int:
    deltas = await run(engine, request)
    return deltas[-1].cached_tokens


def block_floor(n: int, block: int = 16) -> int:
    return n // block * block


# -- protocol and basic shape -------------------------------------------------


async def test_is_an_engine_labelled_sim() -> None:
    async with sim() as engine:
        assert isinstance(engine, Engine)
        assert engine.kind == "sim"
        caps = engine.capabilities
        assert (caps.vision, caps.json_schema, caps.grammar, caps.regex, caps.lora) == (True,) * 5
        assert caps.max_context == 32_768


async def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SY_SIM_MAX_NUM_SEQS", "8")
    monkeypatch.setenv("SY_SIM_DELAY_SCALE", "0")
    s = SimSettings()
    assert (s.max_num_seqs, s.delay_scale, s.block_size) == (8, 0.0, 16)


async def test_output_has_exactly_max_tokens() -> None:
    async with sim() as engine:
        deltas = await run(engine, text_request("len", "hello there", max_tokens=37))
    assert len(deltas) == 37
    assert [d.completion_tokens for d in deltas] == list(range(1, 38))
    assert deltas[-1].finish_reason == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert deltas[-1].prompt_tokens == len(pseudo_tokens("hello there"))


async def test_stop_string_cuts_the_output() -> None:
    async with sim() as engine:
        deltas = await run(engine, text_request("stop", "go", max_tokens=300, stop=["the"]))
    text = "".join(d.text for d in deltas)
    assert deltas[-1].finish_reason == "stop"
    assert "the" not in text
    assert deltas[-1].completion_tokens < 300


async def test_not_started_and_duplicate_ids_are_refused() -> None:
    idle = SimEngine(SimSettings(delay_scale=0))
    with pytest.raises(EngineError, match="not started"):
        await run(idle, text_request("x", "hi"))
    async with sim(delay_scale=1.0) as engine:
        first = engine.generate(text_request("dup", "hi", max_tokens=1000))
        await first.__anext__()
        with pytest.raises(EngineError) as err:
            await run(engine, text_request("dup", "hi"))
        assert err.value.code == "invalid_request"
        await engine.abort("dup")


async def test_context_overflow_is_context_length() -> None:
    async with sim(max_model_len=256) as engine:
        with pytest.raises(EngineError) as err:
            await run(engine, text_request("long", "word " * 300))
        assert err.value.code == "context_length"
        with pytest.raises(EngineError) as err:
            await run(engine, text_request("long2", "word " * 200, max_tokens=100))
        assert err.value.code == "context_length"
    async with sim(kv_capacity_tokens=64) as engine:  # fits the window, not the KV cache
        with pytest.raises(EngineError) as err:
            await run(engine, text_request("kv", "word " * 100))
        assert err.value.code == "context_length"


# -- prefix cache -------------------------------------------------------------


async def test_images_expand_by_qwen_patching_and_keep_their_tokens() -> None:
    async with sim(vlm="qwen2.5-vl") as engine:  # 28-px tokens
        one = engine.prompt_tokens(step("a", [frame(1)], "x"))
        none = engine.prompt_tokens(step("b", [], "x"))
        # 448 * 448 / (28 * 28) = 256 visual tokens plus the start/end markers.
        assert len(one) - len(none) == 256 + 2
        wide = engine.prompt_tokens(step("c", [frame(1, 1280, 720)], "x"))
        assert len(wide) - len(none) == 1176 + 2  # ceil(921,600 / 784)
        # A part naming a frame the request does not carry costs tokens_per_image.
        orphan = EngineRequest(
            request_id="d",
            messages=(ChatMessage(role="user", content=[ImagePart(hash="ab" * 16)]),),
        )
        bare = EngineRequest(request_id="e", messages=(ChatMessage(role="user", content=[]),))
        assert len(engine.prompt_tokens(orphan)) - len(engine.prompt_tokens(bare)) == 256 + 2
        assert engine.prompt_tokens(step("f", [frame(1)], "x")) == one


async def test_repeated_prefix_hits_and_an_episode_hits_more_each_step() -> None:
    async with sim() as engine:
        sys_and_f1 = len(engine.prompt_tokens(step("p", [frame(1)], "")))
        sys_only = len(engine.prompt_tokens(step("p", [], "")))

        assert await cached(engine, step("s1", [frame(1)], "step 1: the menu is open")) == 0
        # Same system prompt and frame, new text: the shared blocks are served from cache.
        again = await cached(engine, step("s1b", [frame(1)], "step 1 retry: tap ok"))
        assert again >= block_floor(sys_and_f1) - 16
        assert again > 0

        # Step 2 of the episode keeps the system prompt and the previous frame first.
        s2 = await cached(engine, step("s2", [frame(1), frame(2)], "step 2: tap start"))
        # Another episode shares only the system prompt.
        other = await cached(engine, step("o1", [frame(99)], "step 1: new episode"))
        assert other <= block_floor(sys_only)
        assert s2 > other
        # Step 3 shares system prompt + both earlier frames: more hits again.
        s3 = await cached(engine, step("s3", [frame(1), frame(2), frame(3)], "step 3"))
        assert s3 > s2 >= block_floor(sys_and_f1) - 16

        # Caching is positional: a sliding window that moves the previous frame
        # to the front gets only the system prompt from the cache.
        slide = await cached(engine, step("w3", [frame(2), frame(3)], "step 3"))
        assert slide <= block_floor(sys_only)

        stats = engine.stats()
        assert stats.prefix_hit_tokens == again + s2 + other + s3 + slide
        assert 0 < stats.prefix_hit_rate < 1


async def test_hits_fall_under_kv_pressure() -> None:
    prompts = [f"tenant question {i}: " + f"w{i} " * 240 for i in range(30)]

    async def replay(engine: SimEngine) -> int:
        await run(engine, text_request("first", prompts[0]))
        for i, p in enumerate(prompts[1:]):
            await run(engine, text_request(f"other-{i}", p))
        return await cached(engine, text_request("again", prompts[0]))

    async with sim(kv_capacity_tokens=200_000) as roomy:
        assert await replay(roomy) > 0
        roomy_rate = roomy.stats().prefix_hit_rate
    async with sim(kv_capacity_tokens=2_048) as tight:  # 128 blocks: ~4 prompts
        assert await replay(tight) == 0
        assert tight.stats().prefix_hit_rate < roomy_rate
        assert tight.stats().kv_cache_usage == 0  # nothing running: nothing pinned


async def test_running_blocks_are_pinned_against_eviction() -> None:
    async with sim(kv_capacity_tokens=1_024, delay_scale=1.0) as engine:
        long = engine.generate(text_request("long", "pinned " * 200, max_tokens=400))
        await long.__anext__()
        usage = engine.stats().kv_cache_usage
        assert usage > 0.5  # ~600 of 1,024 tokens reserved
        # A request that does not fit next to it waits instead of evicting it.
        waiting = asyncio.ensure_future(run(engine, text_request("big", "other " * 500)))
        await asyncio.sleep(0.05)
        assert engine.stats().waiting == 1
        await engine.abort("long")
        deltas = await asyncio.wait_for(waiting, 30)
        assert deltas[-1].finish_reason == "length"
        await long.aclose()


def session_request(rid: str, text: str, session: str | None) -> EngineRequest:
    return EngineRequest(
        request_id=rid, prompt=text, sampling=Sampling(max_tokens=4), tenant="t", session=session
    )


async def evicted_active(active_session_s: float, sessions: bool = True) -> tuple[int, int]:
    """One episode's step, then four other episodes' steps that need its blocks' room: the
    blocks of active sessions the others' admissions evicted, per request and in all."""
    async with sim(kv_capacity_tokens=2_048, active_session_s=active_session_s) as engine:
        await run(engine, session_request("a0", "episode a " * 300, "a" if sessions else None))
        for i in range(4):
            req = session_request(f"o{i}", f"episode {i} " * 300, f"o{i}" if sessions else None)
            await run(engine, req)
        per_request = 0
        for rid in ("a0", "o0", "o1", "o2", "o3"):
            t = engine.timings(rid)
            assert t is not None
            per_request += t.evicted_active
        return per_request, engine.evicted_active_blocks


async def test_evicting_an_active_sessions_blocks_is_counted() -> None:
    # 2,048 tokens hold ~3 of these ~640-token prompts: the later ones evict the first.
    per_request, total = await evicted_active(active_session_s=60.0)
    assert per_request == total > 0
    # The same evictions of a session whose step is long past (the whole run is a few
    # modelled seconds): not an active session's, not counted; nor blocks of no session.
    assert await evicted_active(active_session_s=0.001) == (0, 0)
    assert await evicted_active(active_session_s=60.0, sessions=False) == (0, 0)


def test_the_cache_counts_an_owners_evicted_blocks_only_while_it_is_active() -> None:
    active = {"a"}
    cache = BlockCache(4, active=lambda owner: owner in active)
    cache.acquire([], 2, owner="a")
    cache.commit([b"a1", b"a2"], owner="a")
    cache.release([b"a1", b"a2"], 0)
    cache.acquire([], 2, owner="b")
    cache.commit([b"b1", b"b2"], owner="b")
    cache.release([b"b1", b"b2"], 0)
    cache.acquire([], 2, owner="c")  # evicts a's two blocks (least recently used)
    assert (cache.evicted, cache.evicted_active) == (2, 2)
    active.clear()
    cache.acquire([], 2, owner="c")  # evicts b's, whose owner is not active
    assert (cache.evicted, cache.evicted_active) == (4, 2)


async def test_cache_salt_isolates_tenants() -> None:
    prompt = "SELECT schema for tenant: " + "col " * 200
    async with sim() as engine:
        a = EngineRequest(request_id="a1", prompt=prompt, cache_salt="tenant-a")
        assert await cached(engine, a) == 0
        b = EngineRequest(request_id="b1", prompt=prompt, cache_salt="tenant-b")
        assert await cached(engine, b) == 0  # same text, other salt: nothing shared
        unsalted = EngineRequest(request_id="n1", prompt=prompt)
        assert await cached(engine, unsalted) == 0
        a2 = EngineRequest(request_id="a2", prompt=prompt, cache_salt="tenant-a")
        assert await cached(engine, a2) > 0
        lora = EngineRequest(request_id="l1", prompt=prompt, cache_salt="tenant-a", lora="sql-a")
        assert await cached(engine, lora) == 0  # another adapter computes other KV


# -- timing model -------------------------------------------------------------


async def test_ttft_grows_with_uncached_tokens() -> None:
    async with sim() as engine:
        short = text_request("short", "alpha " * 100)
        long = text_request("long", "beta " * 2000)
        await run(engine, short)
        await run(engine, long)
        await run(engine, text_request("long-again", "beta " * 2000))
        t_short, t_long, t_again = (engine.timings(r) for r in ("short", "long", "long-again"))
        assert t_short and t_long and t_again
        cost = engine.settings.prefill_cost_per_token
        for t in (t_short, t_long, t_again):
            # Idle engine: no queue, no alignment: TTFT = prefill + one decode step.
            assert t.queue == 0
            assert t.ttft == pytest.approx(t.uncached_tokens * cost + engine.tpot(1))
        assert t_long.ttft is not None and t_short.ttft is not None and t_again.ttft is not None
        assert t_long.ttft > t_short.ttft
        assert t_again.cached_tokens > 0
        assert t_again.ttft < t_long.ttft


async def test_tpot_grows_with_batch_size() -> None:
    async with sim() as engine:
        await run(engine, text_request("alone", "solo " + "x " * 50, max_tokens=32))
        alone = engine.timings("alone")
        batch = [
            text_request(f"b{i}", f"request {i:04d} " + "x " * 50, max_tokens=32) for i in range(32)
        ]
        await asyncio.gather(*(run(engine, r) for r in batch))
        together = [engine.timings(f"b{i}") for i in range(32)]
    assert alone is not None and alone.tpot == pytest.approx(engine.tpot(1))
    for t in together:
        assert t is not None and t.tpot == pytest.approx(engine.tpot(32))
    assert engine.tpot(32) > engine.tpot(1)


async def test_waiting_beyond_max_num_seqs_is_queue_time() -> None:
    async with sim(max_num_seqs=2) as engine:
        reqs = [text_request(f"q{i}", f"q {i} " + "y " * 20, max_tokens=10) for i in range(4)]
        await asyncio.gather(*(run(engine, r) for r in reqs))
        queues = [engine.timings(f"q{i}").queue for i in range(4)]  # type: ignore[union-attr]
    assert queues[0] == queues[1] == 0
    assert queues[2] > 0 and queues[3] > 0


def exact_prompt(rid: str, n: int) -> str:
    """A raw prompt of exactly `n` pseudo-tokens that shares no block with another `rid`."""
    head = f"q{rid} "
    text = head + "x " * (n - len(pseudo_tokens(head)))  # " x" is one token
    assert len(pseudo_tokens(text)) == n
    return text


async def test_defaults_reproduce_the_a100_calibration_point() -> None:
    """50 sequences decoding and a typical agent step (~300 uncached tokens, 16 output
    tokens) arriving at a random moment of a step with no other prefill under way:
    TTFT ~58 ms and TPOT ~16.4 ms, as measured for Qwen2.5-VL-7B on one A100.

    The arrival's moment within the step is what the wall clock gives (delay_scale 0.5),
    so the alignment averages half a step, as it does for the benchmark's requests."""
    rng = random.Random(7)
    async with sim(delay_scale=0.5) as engine:
        assert engine.calibration == "a100@qwen2.5-vl-7b"
        assert engine.tpot(50) == pytest.approx(0.01636, rel=0.01)
        assert engine.tpot(10) == pytest.approx(0.01636 / 1.2, rel=0.01)
        background = [
            engine.generate(text_request(f"bg{i}", exact_prompt(f"bg{i}", 50), max_tokens=5000))
            for i in range(49)
        ]
        for stream in background:
            await stream.__anext__()  # all 49 decoding
        probes = []
        # Built beforehand: CPU work between a sleep and the arrival would make the
        # engine late, and a late engine takes arrivals at its step's end.
        steps = [
            text_request(f"p{k}", exact_prompt(f"p{k}", 300), max_tokens=16) for k in range(16)
        ]
        for req in steps:
            await asyncio.sleep(rng.uniform(0.002, 0.02))
            await run(engine, req)
            probes.append(engine.timings(req.request_id))
        for i, stream in enumerate(background):
            await engine.abort(f"bg{i}")
            await stream.aclose()
    step = engine.step_time(50, 300)
    for t in probes:
        assert t is not None and t.ttft is not None
        assert (t.queue, t.uncached_tokens) == (0, 300)
        assert t.prefill == pytest.approx(step)  # one step: 50 sequences + its 300 tokens
        assert 0 <= t.ttft - t.prefill <= engine.tpot(50) + 1e-9  # the alignment
        assert t.tpot == pytest.approx(engine.tpot(50))  # its later steps carry no prefill
    # The calibration point: its prefill step plus, on average, half a decode step of
    # waiting for that step to start. Computed from the engine's model, not from the
    # probes' mean alignment: that one is the wall clock's, and on a loaded machine a
    # late engine takes most arrivals at a step's end (a mean of ~52 ms was seen).
    assert step + engine.tpot(50) / 2 == pytest.approx(0.058, rel=0.10)


async def test_prefill_is_chunked_under_the_step_budget() -> None:
    """Decodes first, then prefill chunks in admission order within the budget; the step
    that finishes a prompt emits its first token; decoders see the longer steps."""
    cost = SimSettings(model="qwen2.5-vl-7b").prefill_cost_per_token
    async with sim(max_num_batched_tokens=1000) as engine:
        reqs = [text_request(r, exact_prompt(r, 600), max_tokens=4) for r in "abc"]
        await asyncio.gather(*(run(engine, r) for r in reqs))
        a, b, c = (engine.timings(r) for r in "abc")
        step1 = engine.step_time(2, 1000)  # a: 600, b: 400 of its 600
        step2 = engine.step_time(3, 800)  # a decodes (1 of the budget); b: 200, c: 600
        assert step1 == pytest.approx(engine.tpot(2) + 1000 * cost)
        assert a is not None and b is not None and c is not None
        assert a.ttft == pytest.approx(step1)
        assert b.ttft == pytest.approx(step1 + step2)
        assert c.ttft == pytest.approx(step1 + step2)
        # a's second token waited through the step that carried 800 prefill tokens.
        assert a.tpot == pytest.approx((step2 + 2 * engine.tpot(3)) / 3)
        # b's later steps: two with a, c beside it, then a is done (4 tokens).
        assert b.tpot == pytest.approx((2 * engine.tpot(3) + engine.tpot(2)) / 3)
        # c was admitted at once but waited a step for budget: that is prefill, not queue.
        assert c.queue == 0 and c.prefill == pytest.approx(step1 + step2)

    async with sim(max_num_batched_tokens=512) as engine:
        await run(engine, text_request("long", exact_prompt("long", 2000), max_tokens=2))
        t = engine.timings("long")
        # ceil(2000 / 512) = 4 steps of one sequence: the cost of every token, once.
        assert t is not None and t.ttft == pytest.approx(4 * engine.tpot(1) + 2000 * cost)


def due_in(req: EngineRequest, seconds: float) -> EngineRequest:
    return dataclasses.replace(req, due=time.time() + seconds)


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
async def test_an_earlier_due_step_overtakes_queued_later_ones(policy: str) -> None:
    """One slot, busy: three steps queue behind it, the one due soonest arriving last.
    Under `priority` it runs first (earliest due time first, arrival order among the
    two due later, and a request without a due time after them); under `fcfs`, last."""
    async with sim(max_num_seqs=1, scheduling_policy=policy) as engine:
        busy = engine.generate(text_request("busy", "busy", max_tokens=50))
        await busy.__anext__()
        queued = [
            text_request("none", "no due time"),
            due_in(text_request("late1", "due later"), 10),
            due_in(text_request("late2", "due later too"), 10),
            due_in(text_request("soon", "due soon"), 1),
        ]
        await asyncio.gather(*(run(engine, r) for r in queued), run_rest(busy))
        t = {r.request_id: engine.timings(r.request_id) for r in queued}
    # The same arrival (a step boundary, delay scale 0): the time queued is the order.
    queued_s = {rid: (x.queue if x is not None else math.inf) for rid, x in t.items()}
    ranked = sorted(queued_s, key=lambda rid: queued_s[rid])
    if policy == "priority":
        assert ranked == ["soon", "late1", "late2", "none"]
    else:
        assert ranked == ["none", "late1", "late2", "soon"]


async def run_rest(stream: AsyncIterator[Delta]) -> None:
    async for _ in stream:
        pass


async def test_priority_orders_prefills_not_yet_begun_and_a_begun_one_keeps_its_place() -> None:
    """Two steps arrive while a long prompt without a due time is mid-prefill: under
    `priority` the one due sooner gets its chunks first, under `fcfs` the one that came
    first; the begun prompt keeps its place under both (vLLM never re-sorts its running
    requests), so its first token comes at the same modelled time."""
    firsts: dict[str, dict[str, float]] = {}
    for policy in ("priority", "fcfs"):
        async with sim(max_num_batched_tokens=1000, scheduling_policy=policy) as engine:
            long = asyncio.ensure_future(
                run(engine, text_request("long", exact_prompt("long", 1500), max_tokens=4))
            )
            while engine.clock == 0:  # its first chunk (1,000 of 1,500 tokens) ran
                await asyncio.sleep(0)
            arrived = engine.clock
            later = due_in(text_request("later", exact_prompt("later", 900), max_tokens=4), 10)
            sooner = due_in(text_request("sooner", exact_prompt("sooner", 900), max_tokens=4), 1)
            await asyncio.gather(long, run(engine, later), run(engine, sooner))
            t = {rid: engine.timings(rid) for rid in ("long", "later", "sooner")}
        firsts[policy] = {rid: x.ttft for rid, x in t.items() if x is not None and x.ttft}
        firsts[policy]["long"] -= arrived  # the others' ttft count from their arrival
    p, f = firsts["priority"], firsts["fcfs"]
    assert p["sooner"] < p["later"]
    assert f["later"] < f["sooner"]
    assert p["long"] == pytest.approx(f["long"])
    assert p["long"] < p["sooner"]


async def test_frames_arriving_together_prefill_one_after_another() -> None:
    """50 frames of 1,200 uncached tokens at once: a GPU prefills them in turn, so the
    last first token comes after all 60,000 tokens' compute, and the steady state of a
    closed loop of agents cannot prefill faster than 1 / prefill_cost_per_token."""
    async with sim() as engine:
        cost = engine.settings.prefill_cost_per_token
        reqs = [
            text_request(f"f{i}", exact_prompt(f"f{i}", 1200), max_tokens=16) for i in range(50)
        ]
        await asyncio.gather(*(run(engine, r) for r in reqs))
        timed = [engine.timings(f"f{i}") for i in range(50)]
    ttft = [t.ttft for t in timed if t is not None and t.ttft is not None]
    assert len(ttft) == 50
    assert ttft == sorted(ttft)  # FCFS: a later frame never gets its token earlier
    assert ttft[-1] >= 50 * 1200 * cost  # 6.6 s of prefill before the last token
    # Eight 8,192-token steps of at most 50 sequences carry it: little more than the work.
    assert ttft[-1] <= 50 * 1200 * cost + 8 * engine.tpot(50)
    assert ttft[0] <= 8192 * cost + engine.tpot(7)  # the first rides the first step

    async with sim() as engine:
        cost = engine.settings.prefill_cost_per_token

        async def client(c: int) -> int:
            done = 0
            for k in range(6):
                rid = f"c{c}-{k}"
                await run(engine, text_request(rid, exact_prompt(rid, 300), max_tokens=16))
                done += 300
            return done

        prefilled = sum(await asyncio.gather(*(client(c) for c in range(50))))
        rate = prefilled / engine.clock
    # Bounded by compute (~9,100 tokens/s on an A100) and close to it: prefill-bound.
    assert 0.8 / cost < rate <= 1 / cost


async def test_gpu_time_is_each_requests_share_of_the_steps_not_its_waiting() -> None:
    """Requests that arrive together keep the engine busy until the last one ends: their
    `gpu` shares add up to exactly that span, while their prefill + decode, which count
    the steps each waited through, add up to several times it."""
    async with sim() as engine:
        reqs = [
            text_request(f"g{i}", exact_prompt(f"g{i}", 3000), max_tokens=8 * (i + 1))
            for i in range(6)
        ]
        await asyncio.gather(*(run(engine, r) for r in reqs))
        timed = [t for i in range(6) if (t := engine.timings(f"g{i}")) is not None]
        span = engine.clock
    assert len(timed) == 6
    assert sum(t.gpu for t in timed) == pytest.approx(span, rel=1e-9)
    assert sum(t.total - t.queue for t in timed) > 3 * span
    # A request's share: its own prefill in full, the batch-wide part shared.
    assert all(3000 * engine.settings.prefill_cost_per_token < t.gpu < t.total for t in timed)


async def test_delay_scale_zero_answers_fast() -> None:
    async with sim(delay_scale=0.0) as engine:
        start = time.perf_counter()
        reqs = [text_request(f"f{i}", f"fast {i} " + "z " * 100, max_tokens=128) for i in range(64)]
        results = await asyncio.gather(*(run(engine, r) for r in reqs))
        wall = time.perf_counter() - start
        modelled = engine.timings("f0")
    assert all(len(r) == 128 for r in results)
    assert wall < 3.0
    assert modelled is not None and modelled.total > 1.0  # the model still says ~2 s


async def test_small_delay_scale_tracks_the_model() -> None:
    async with sim(delay_scale=0.5) as engine:
        start = time.perf_counter()
        await run(engine, text_request("w", "wall " * 100, max_tokens=20))
        wall = time.perf_counter() - start
        modelled = engine.timings("w")
    assert modelled is not None
    assert wall == pytest.approx(modelled.total * 0.5, abs=0.1)


async def test_it_reports_the_modelled_cost_as_a_result_carries_it() -> None:
    async with sim(delay_scale=0.0) as engine:
        assert isinstance(engine, ModelsCost)
        await run(engine, text_request("m", "cost " * 100, max_tokens=20))
        t, modelled = engine.timings("m"), engine.modelled_timings("m")
        assert engine.modelled_timings("never-ran") is None
    assert t is not None and modelled is not None
    assert (modelled.queue, modelled.prefill, modelled.total) == (t.queue, t.prefill, t.total)
    assert modelled.decode == pytest.approx(t.total - t.queue - t.prefill)


# -- abort ----------------------------------------------------------------------


async def test_abort_waiting_and_running_requests() -> None:
    async with sim(max_num_seqs=1, delay_scale=1.0) as engine:
        running = engine.generate(text_request("run", "long task", max_tokens=5000))
        first = await running.__anext__()
        assert first.completion_tokens == 1
        queued = asyncio.ensure_future(run(engine, text_request("wait", "queued task")))
        await asyncio.sleep(0.02)
        assert (engine.stats().running, engine.stats().waiting) == (1, 1)

        await engine.abort("wait")
        waited = await asyncio.wait_for(queued, 5)
        assert [d.finish_reason for d in waited] == ["abort"]
        assert waited[-1].completion_tokens == 0
        assert engine.stats().waiting == 0

        await engine.abort("run")
        rest = [d async for d in running]
        assert rest[-1].finish_reason == "abort"
        assert rest[-1].completion_tokens < 5000
        stats = engine.stats()
        assert (stats.running, stats.waiting, stats.kv_cache_usage) == (0, 0, 0)
        assert engine.timings("run").finish_reason == "abort"  # type: ignore[union-attr]
        assert engine.timings("wait").finish_reason == "abort"  # type: ignore[union-attr]
        await engine.abort("unknown")  # a no-op


async def test_a_consumer_that_leaves_frees_its_slot() -> None:
    async with sim(delay_scale=1.0) as engine:
        stream = engine.generate(text_request("gone", "bye", max_tokens=5000))
        await stream.__anext__()
        assert engine.stats().running == 1
        await stream.aclose()
        assert engine.stats().running == 0


# -- outputs --------------------------------------------------------------------


class AgentAnswer(BaseModel):
    thought: Annotated[str, StringConstraints(max_length=40)] | None = None
    actions: Annotated[list[Action], Field(min_length=1, max_length=3)]


CUSTOM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["tap", "swipe", "wait"]},
        "version": {"const": 2},
        "x": {"type": "integer", "minimum": 10, "maximum": 20},
        "odd": {"type": "integer", "exclusiveMinimum": 0, "maximum": 9, "multipleOf": 3},
        "score": {"type": "number", "minimum": 0.5, "exclusiveMaximum": 1},
        "ok": {"type": "boolean"},
        "name": {"type": "string", "minLength": 5, "maxLength": 8},
        "when": {"type": "string", "format": "date-time"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2, "uniqueItems": True},
        "target": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/point"}]},
        "step": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"op": {"const": "a"}, "n": {"type": "integer"}},
                    "required": ["n"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {"op": {"const": "b"}, "n": {"type": "integer"}},
                    "required": ["n"],
                    "additionalProperties": False,
                },
            ]
        },
        "both": {"allOf": [{"$ref": "#/$defs/point"}, {"required": ["label"]}]},
        "maybe": {"type": ["string", "null"]},
    },
    "required": [
        "kind",
        "x",
        "odd",
        "score",
        "ok",
        "name",
        "when",
        "tags",
        "target",
        "step",
        "both",
    ],
    "$defs": {
        "point": {
            "type": "object",
            "properties": {"px": {"type": "integer", "minimum": 0}, "label": {"type": "string"}},
            "required": ["px"],
        }
    },
}


@pytest.mark.parametrize(
    "schema",
    [AgentAnswer.model_json_schema(), CUSTOM_SCHEMA],
    ids=["agent-action", "custom"],
)
async def test_json_schema_output_validates(schema: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    async with sim() as engine:
        for i in range(40):
            req = step(
                f"j{i}",
                [frame(i)],
                f"step {i}",
                max_tokens=512,
                constraint=JsonSchemaConstraint(json_schema=schema),
            )
            deltas = await run(engine, req)
            text = "".join(d.text for d in deltas)
            validator.validate(json.loads(text))
            assert deltas[-1].finish_reason == "stop"
            assert deltas[-1].completion_tokens == len(pseudo_tokens(text)) == len(deltas)
    if schema is not CUSTOM_SCHEMA:
        AgentAnswer.model_validate_json(text)


async def test_agent_schema_outputs_vary_with_the_prompt_but_not_on_replay() -> None:
    schema = TypeAdapter(list[Action]).json_schema()
    constraint = JsonSchemaConstraint(json_schema=schema)

    async def answer(engine: SimEngine, rid: str, prompt: str) -> str:
        req = EngineRequest(
            request_id=rid, prompt=prompt, constraint=constraint, sampling=Sampling(max_tokens=200)
        )
        return "".join(d.text for d in await run(engine, req))

    async with sim(seed=1) as one, sim(seed=1) as two, sim(seed=2) as other:
        a = [await answer(one, f"a{i}", f"frame {i}") for i in range(10)]
        b = [await answer(two, f"b{i}", f"frame {i}") for i in range(10)]
        c = [await answer(other, f"c{i}", f"frame {i}") for i in range(10)]
    assert a == b  # deterministic given the seed
    assert a != c
    assert len(set(a)) > 1


async def test_json_truncated_by_max_tokens_finishes_with_length() -> None:
    async with sim() as engine:
        req = step(
            "trunc",
            [],
            "x",
            max_tokens=3,
            constraint=JsonSchemaConstraint(json_schema=AgentAnswer.model_json_schema()),
        )
        deltas = await run(engine, req)
    assert len(deltas) == 3 and deltas[-1].finish_reason == "length"


@pytest.mark.parametrize(
    ("constraint", "expected"),
    [
        (JsonObjectConstraint(), "{}"),
        (GrammarConstraint(gbnf='root ::= "a"'), CONSTRAINED_PLACEHOLDER),
        (RegexConstraint(pattern="[a-z]+"), CONSTRAINED_PLACEHOLDER),
    ],
)
async def test_other_constraints(constraint: Constraint, expected: str) -> None:
    async with sim() as engine:
        deltas = await run(engine, step("c", [], "x", max_tokens=64, constraint=constraint))
    assert "".join(d.text for d in deltas) == expected
    assert deltas[-1].finish_reason == "stop"


async def test_choice_output_is_one_of_the_choices_and_follows_the_prompt() -> None:
    choices = ["yes", "no", "maybe later"]
    constraint = ChoiceConstraint(choices=choices)
    async with sim() as engine:
        outputs = []
        for i in range(30):
            deltas = await run(engine, step(f"ch{i}", [], f"question {i}", constraint=constraint))
            outputs.append("".join(d.text for d in deltas))
            assert deltas[-1].finish_reason == "stop"
        replay = await run(engine, step("again", [], "question 0", constraint=constraint))
    assert set(outputs) <= set(choices)
    assert len(set(outputs)) > 1  # the pick depends on the prompt...
    assert "".join(d.text for d in replay) == outputs[0]  # ...and only on it


async def test_unsatisfiable_schema_is_invalid_request() -> None:
    bad = {"type": "integer", "minimum": 5, "maximum": 1}
    async with sim() as engine:
        with pytest.raises(EngineError) as err:
            await run(
                engine, step("bad", [], "x", constraint=JsonSchemaConstraint(json_schema=bad))
            )
    assert err.value.code == "invalid_request"


async def test_stats_track_kv_use_while_running() -> None:
    async with sim(delay_scale=1.0) as engine:
        stream = engine.generate(text_request("kv", "tokens " * 400, max_tokens=2000))
        await stream.__anext__()
        busy = engine.stats()
        await engine.abort("kv")
        await stream.aclose()
        idle = engine.stats()
    assert busy.running == 1 and busy.kv_cache_usage > 0
    assert idle.running == 0 and idle.kv_cache_usage == 0
    assert idle.prefix_queried_tokens == busy.prefix_queried_tokens > 400


# -- calibration presets ----------------------------------------------------------


def test_gpu_presets_fill_the_hardware_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from switchyard.capacity import sim_calibration

    assert SimSettings().calibration == "a100"
    assert SimSettings().overridden() == []
    h100 = SimSettings(gpu="h100")
    assert {k: getattr(h100, k) for k in CALIBRATED} == sim_calibration("h100").settings()
    # From the environment, and an explicit figure wins over the preset's.
    monkeypatch.setenv("SY_SIM_GPU", "rtx5090")
    monkeypatch.setenv("SY_SIM_PREFILL_COST_PER_TOKEN", "0.0002")
    s = SimSettings()
    cal = sim_calibration("rtx5090")
    assert (s.gpu, s.tpot_base, s.kv_capacity_tokens) == ("rtx5090", cal.tpot_base,
                                                           cal.kv_capacity_tokens)  # fmt: skip
    assert s.prefill_cost_per_token == 0.0002
    assert s.overridden() == ["prefill_cost_per_token"]
    assert s.calibration == "rtx5090+custom"
    monkeypatch.delenv("SY_SIM_PREFILL_COST_PER_TOKEN")
    assert SimSettings(tpot_base=cal.tpot_base).calibration == "rtx5090"  # the same figure
    with pytest.raises(ValidationError, match="a100, h100, rtx5090"):
        SimSettings(gpu="b200")
    with pytest.raises(ValidationError, match="max_num_batched_tokens"):
        SimSettings(max_num_seqs=256, max_num_batched_tokens=128)


async def test_every_timing_carries_its_calibration() -> None:
    async with sim(gpu="h100") as fast, sim(gpu="rtx5090") as slow:
        for engine in (fast, slow):
            await run(engine, text_request("t", exact_prompt("t", 1200), max_tokens=8))
        f, s = fast.timings("t"), slow.timings("t")
        fm, sm = fast.modelled_timings("t"), slow.modelled_timings("t")
    assert f is not None and s is not None and fm is not None and sm is not None
    assert (f.calibration, fm.calibration, s.calibration, sm.calibration) == (
        "h100@qwen2.5-vl-7b", "h100@qwen2.5-vl-7b", "rtx5090@qwen2.5-vl-7b",
        "rtx5090@qwen2.5-vl-7b",
    )  # fmt: skip
    assert f.ttft is not None and s.ttft is not None and f.ttft < s.ttft


def test_the_engine_factory_takes_the_preset_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from switchyard.engines.factory import make_engine

    monkeypatch.setenv("SY_SIM_GPU", "h100")
    engine = make_engine("sim")
    assert isinstance(engine, SimEngine) and engine.calibration == "h100"
    assert engine.tpot(50) < SimEngine(SimSettings(gpu="a100")).tpot(50)


# -- Qwen3-VL-8B: the encoder and attention terms, precision ---------------------------


async def test_qwen3_vl_prefill_adds_the_encoder_once_per_uncached_frame() -> None:
    """The default model pays the vision encoder for a frame whose tokens are not cached
    and attention growing with the position; a repeat of the same frame pays neither."""
    from switchyard.capacity.calibration import encoder_seconds, prefill_chunk_seconds

    async with sim(model="qwen3-vl-8b") as engine:
        s = engine.settings
        assert s.model == "qwen3-vl-8b" and engine.calibration == "a100"
        img = frame(1, 1280, 704)  # 40 x 22 = 880 visual tokens of 32 px, 3,520 patches
        first = EngineRequest(
            request_id="f1", prompt="look " * 40, images=(img,),
            sampling=Sampling(max_tokens=1, temperature=0.0),
        )  # fmt: skip
        await run(engine, first)
        t = engine.timings("f1")
        assert t is not None and t.ttft is not None
        n = t.uncached_tokens
        expected = engine.tpot(1) + prefill_chunk_seconds(s, 0, n) + encoder_seconds(s, 3520)
        assert t.ttft == pytest.approx(expected)
        assert encoder_seconds(s, 3520) > 0.3 * expected  # the encoder is no rounding error
        again = dataclasses.replace(first, request_id="f2")
        await run(engine, again)
        t2 = engine.timings("f2")
        assert t2 is not None and t2.ttft is not None and t2.cached_tokens > 0
        assert t2.ttft == pytest.approx(engine.tpot(1) + prefill_chunk_seconds(
            s, t2.cached_tokens, t2.uncached_tokens))  # fmt: skip


def test_precision_is_a_preset_setting_and_fp8_needs_a_card_with_fp8(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic import ValidationError

    bf16, fp8 = SimSettings(gpu="rtx5090"), SimSettings(gpu="rtx5090", precision="fp8")
    assert (bf16.calibration, fp8.calibration) == ("rtx5090", "rtx5090+fp8")
    assert fp8.overridden() == []
    # W8A8: half the weight bytes a decode step reads (the LM head stays BF16), twice the
    # matmul rate; the KV cache is fp8 in both, so the cache grows by the weights freed.
    assert 0.5 * bf16.tpot_base < fp8.tpot_base < 0.6 * bf16.tpot_base
    assert fp8.prefill_cost_per_token == pytest.approx(bf16.prefill_cost_per_token / 2, rel=1e-4)
    assert fp8.tpot_per_seq == bf16.tpot_per_seq
    assert fp8.kv_capacity_tokens > 2 * bf16.kv_capacity_tokens
    monkeypatch.setenv("SY_SIM_PRECISION", "fp8")
    monkeypatch.setenv("SY_SIM_GPU", "h100")
    assert SimSettings().calibration == "h100+fp8"
    monkeypatch.setenv("SY_SIM_GPU", "a100")
    with pytest.raises(ValidationError, match="no FP8 tensor math"):
        SimSettings()


# -- speculative decoding ----------------------------------------------------------------


def test_ngram_steps_propose_what_followed_the_longest_earliest_match() -> None:
    from switchyard.engines.sim_output import DraftStep, ngram_steps

    context = ["a", "b", "c", "d", "x", "b", "c", "e", "a", "b"]
    # Suffix "a b" (2 tokens) first occurs at 0: proposes "c d x"; the answer goes on
    # "c d y": 2 accepted, then the step's own token ("y"), 3 emitted.
    steps = ngram_steps(context, ["q", "c", "d", "y", "z"], k=3, n_min=1, n_max=2)
    assert steps[0] == DraftStep(drafted=0, accepted=0, emitted=1)  # "q": nothing before
    out = ngram_steps(context, ["a", "b", "c", "d", "y"], k=3, n_min=1, n_max=3)
    # after "...e a b" + "a": the longest earlier suffix is "a" (at 0) -> "b c d", all right:
    assert out[0] == DraftStep(drafted=3, accepted=3, emitted=4)
    assert sum(s.emitted for s in out) == 4  # every token after the first, once
    # k caps the draft, n_min excludes shorter matches, and no match drafts nothing
    assert ngram_steps(["a", "b", "c"], ["a", "b", "c"], 1, 1, 1)[0] == DraftStep(1, 1, 2)
    assert ngram_steps(["a", "b", "c"], ["a", "b", "c"], 2, 2, 2)[0] == DraftStep(0, 0, 1)
    # visual tokens never match (an answer holds none)
    img = ["<img:h:0>", "<img:h:1>", "k"]
    assert ngram_steps(img, ["w", "w", "w"], 2, 1, 2)[0].drafted == 0


async def test_speculation_emits_the_same_answer_in_fewer_steps_at_a_verify_cost() -> None:
    """A JSON agent answer whose template is in the prompt: same text, fewer decode steps,
    each step's drafted tokens computed like prefill (exact at delay_scale 0)."""
    from switchyard.agentactions import ANSWER_INSTRUCTIONS
    from switchyard.messages.inference import ActionsConstraint

    prompt = ANSWER_INSTRUCTIONS["json"] + ' before: {"type":"click","x":12,"y":34}'
    req = EngineRequest(
        request_id="spec", messages=(ChatMessage(role="user", content=prompt),),
        sampling=Sampling(max_tokens=64), constraint=ActionsConstraint(action_format="json"),
    )  # fmt: skip
    runs = {}
    for k in (0, 3):
        eng = SimEngine(SimSettings(delay_scale=0.0, speculative_tokens=k))
        await eng.start()
        try:
            deltas = [d async for d in eng.generate(req)]
            runs[k] = (deltas, eng.timings("spec"), eng)
        finally:
            await eng.close()
    (plain, t0, _), (spec, t3, eng3) = runs[0], runs[3]
    assert "".join(d.text for d in spec) == "".join(d.text for d in plain)
    assert spec[-1].completion_tokens == plain[-1].completion_tokens
    assert t0 is not None and t3 is not None and t0.drafted == 0
    assert 0 < t3.accepted <= t3.drafted
    assert len(spec) == len(plain) - t3.accepted  # each accepted token saves one step
    s = eng3.settings
    decode_steps = len(spec) - 1
    expected = t3.prefill + decode_steps * eng3.tpot(1) + t3.drafted * s.prefill_cost_per_token
    assert t3.total == pytest.approx(expected)


def test_the_acceptance_bench_finds_json_templates_more_predictable_than_compact() -> None:
    """`bench.specaccept` on a short episode: JSON's keys are in the prompt, compact's
    numbers are not. A step emits its accepted drafts and one more token, but for the
    last, whose drafts may be all that is left."""
    from switchyard.bench.specaccept import measure

    js, compact = (measure(f, 2, 1, 3, episodes=1, steps=6) for f in ("json", "compact"))
    for a in (js, compact):
        assert a.steps <= a.emitted <= a.steps + a.accepted and 0 <= a.accepted <= a.drafted
    assert js.rate > compact.rate and js.tokens_per_step > compact.tokens_per_step


async def test_a_decode_stage_moves_its_kv_over_the_link_and_computes_one_token() -> None:
    """A decode stage (#39) pays no encoder and no prefill: its uncached prompt tokens'
    KV crosses the link (bytes / link bandwidth), then one step samples its first token.
    Its answer is the one the whole request gets, and the moved KV is cached here after,
    so the session's next step moves only what is new."""
    async with sim(model="qwen3-vl-8b", gpu="rtx5090") as engine:
        s = engine.settings
        img = frame(1, 1280, 704)
        whole = EngineRequest(
            request_id="w1", prompt="look " * 40, images=(img,),
            sampling=Sampling(max_tokens=4, temperature=0.0),
        )  # fmt: skip
        handoff = KvHandoff(worker="p1", tokens=900, prefilled_at=0.0)
        decode = dataclasses.replace(whole, request_id="d1", handoff=handoff)
        answers = await run(engine, decode)
        t = engine.timings("d1")
        assert t is not None and t.ttft is not None and t.cached_tokens == 0
        moved = t.prompt_tokens * s.kv_bytes_per_token / (s.kv_link_gbs * 1e9)
        last = prefill_chunk_seconds(s, t.prompt_tokens - 1, 1)  # the token vLLM computes
        assert t.ttft == pytest.approx(moved + engine.tpot(1) + last)
        assert moved < 0.01 < encoder_seconds(s, 3520)  # ~3 ms of PCIe against ~93 ms
        # The same answer a colocated engine writes for the same prompt.
        async with sim(model="qwen3-vl-8b", gpu="rtx5090") as other:
            assert "".join(d.text for d in await run(other, whole)) == "".join(
                d.text for d in answers
            )
        # The next step of the session extends the prompt: only its new tokens move.
        nxt = dataclasses.replace(decode, request_id="d2", prompt="look " * 40 + "again " * 64)
        await run(engine, nxt)
        t2 = engine.timings("d2")
        assert t2 is not None and t2.ttft is not None and t2.cached_tokens > 0
        new = t2.prompt_tokens - t2.cached_tokens
        last = prefill_chunk_seconds(s, t2.prompt_tokens - 1, 1)
        assert t2.ttft == pytest.approx(
            new * s.kv_bytes_per_token / (s.kv_link_gbs * 1e9) + engine.tpot(1) + last
        )


async def test_a_prefill_stage_holds_its_kv_until_the_decode_worker_has_pulled_it() -> None:
    """#39: a prefill worker's KV counts against its cache after the stage ends, for as
    long as the link takes to move the prompt (vLLM's connectors free a producer's blocks
    once the consumer has read them). A request that needs that room waits for it; a
    colocated request's blocks are free (cached, evictable) the moment it ends."""
    over = {"kv_capacity_tokens": 2048, "block_size": 16, "kv_link_gbs": 1.0,
            "kv_bytes_per_token": 2048}  # fmt: skip
    for producer in (True, False):
        async with sim(**over) as engine:
            stage = EngineRequest(
                request_id="p1", prompt="word " * 1200,
                sampling=Sampling(max_tokens=1, temperature=0.0), kv_producer=producer,
            )  # fmt: skip
            await run(engine, stage)
            t1 = engine.timings("p1")
            assert t1 is not None and 1024 < t1.prompt_tokens < 2048  # two never fit
            hold = t1.prompt_tokens * 2048 / 1e9  # the prompt over a 1 GB/s link
            held = engine.stats().kv_cache_usage
            assert (held > 0.5) if producer else (held == 0), held
            # Another prompt as long: it fits only once the first's blocks are free.
            other = dataclasses.replace(stage, request_id="n1", prompt="other " * 1200,
                                        kv_producer=False)  # fmt: skip
            await run(engine, other)
            t2 = engine.timings("n1")
            assert t2 is not None and t2.prompt_tokens > 1024
            if producer:
                assert t2.queue >= hold * 0.99, (t2.queue, hold)
            else:
                assert t2.queue < hold / 10, (t2.queue, hold)
            assert engine.stats().kv_cache_usage == 0  # both released in the end
