"""`sy bench engine`: a raw engine (llama.cpp, vLLM or the sim) against the same requests
served by a worker over NATS, interleaved round by round so machine noise hits both alike.

The raw engine runs in this process, built from the same `SY_<ENGINE>_*` environment the
worker reads (`make_engine`), so both paths run the same model with the same settings.
Each round sends the same requests (same prompts, `max_tokens`, temperature 0, the same
seeds) down both paths one after the other, `concurrency` at a time; only one engine
has work at any moment. The paths take turns going first, and with vLLM the switch
from one to the other waits a moment: its idle engine keeps polling for work for a
second after its last step, which would otherwise eat into the other path's first.
Round 0 warms both paths (and their prefix caches) up and is not counted. Tokens are
the completion tokens of the engine's usage on both sides (the raw engine's final
count, the worker's result `usage`), so a path that stopped earlier at an end of
sequence is not flattered.

`fleet_hops_ms` splits a served request (medians, ms): `to_worker` from the publish to
the worker starting it (JetStream, the pull), `on_engine` from there to its last token,
`to_client` from then to the end frame at this client (the result to `RES`, the frame);
`raw_request_ms` is the raw engine's median request, to set beside `on_engine`.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar, cast

from switchyard import eventloop, subjects
from switchyard.bench.stats import Report
from switchyard.bus.connection import Bus, connect
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.config import Settings
from switchyard.engines.base import Engine as EngineProtocol
from switchyard.engines.base import EngineRequest
from switchyard.engines.factory import make_engine
from switchyard.fleet import Fleet, FleetSpec, Pool, launch
from switchyard.fleet.launch import READY_TIMEOUT
from switchyard.fleet.spec import Engine
from switchyard.messages.inference import ChatMessage, GenerateRequest, Sampling
from switchyard.partition import partition

POOL = "bench"
PARTITIONS = 4
PROMPTS = (
    "Describe the main menu of a mobile strategy game.",
    "List five things a player can do in a farming game.",
    "Explain how a daily login reward works.",
    "Write a short note about a server maintenance window.",
)


def numbered_messages(i: int) -> list[dict[str, str]]:
    """Request `i` of the overhead runs (`sy bench edge`, `sy bench peers overhead`): the
    prompts in turn, each numbered, so no two requests are alike."""
    return [{"role": "user", "content": f"{PROMPTS[i % len(PROMPTS)]} (#{i})"}]


# s between the two paths' phases of a round, by engine: an idle vLLM engine busy-polls
# its message queue for 1 s after its last read (vllm shm_broadcast `busy_loop_s`).
SETTLE_S = {"vllm": 1.5}

T = TypeVar("T")


@dataclass
class EngineBench(Report):
    engine: str
    concurrency: int  # requests in flight at once, on either path
    rounds: int
    requests_per_round: int
    max_tokens: int
    raw_tokens_per_s: float  # median over rounds
    fleet_tokens_per_s: float
    ratio: float  # fleet / raw
    raw_rounds: list[float]
    fleet_rounds: list[float]
    raw_round_tokens: list[int]  # completion tokens per round, as the engine counted them
    fleet_round_tokens: list[int]
    fleet_overhead_ms_per_request: float  # median extra wall time per request
    fleet_hops_ms: dict[str, float] = field(default_factory=dict)  # medians, see above
    raw_request_ms: float = 0.0  # median, from generate() to the last token


@dataclass
class _Served:
    tokens: int
    sent: float
    started: float | None
    finished: float
    received: float


def _requests(n: int, max_tokens: int, rnd: int) -> list[GenerateRequest]:
    return [
        GenerateRequest(
            tenant="bench",
            workload="llm",
            pool=POOL,
            session=f"s{rnd}-{i}",
            messages=[ChatMessage(role="user", content=PROMPTS[i % len(PROMPTS)])],
            sampling=Sampling(max_tokens=max_tokens, temperature=0.0, seed=i),
        )
        for i in range(n)
    ]


async def _spread(
    items: Sequence[GenerateRequest],
    concurrency: int,
    one: Callable[[GenerateRequest], Awaitable[T]],
) -> list[T]:
    """`one` over `items`, at most `concurrency` at a time, results in order. The
    semaphore wakes waiters in order, so requests start in the same order on both paths."""
    gate = asyncio.Semaphore(concurrency)

    async def run(item: GenerateRequest) -> T:
        async with gate:
            return await one(item)

    return await asyncio.gather(*(run(item) for item in items))


async def _raw_one(engine: EngineProtocol, req: GenerateRequest) -> tuple[int, float]:
    """The completion tokens of one request and its wall time."""
    tokens = 0
    started = time.perf_counter()
    async for delta in engine.generate(EngineRequest.from_generate(req)):
        if delta.finish_reason is not None:
            tokens = delta.completion_tokens
    return tokens, time.perf_counter() - started


async def _served_one(bus: Bus, req: GenerateRequest) -> _Served:
    key = req.session or req.tenant
    async with TokenStreamReader(bus.nc, idle_timeout=120) as reader:
        sent = time.time()
        update = {"reply": reader.inbox, "id": req.id + "f", "created_at": sent}
        await publish(
            bus.js, subjects.work(POOL, partition(key, PARTITIONS)), req.model_copy(update=update)
        )
        async for frame in reader:
            if frame.type == "end" and frame.result:
                result = frame.result
                if result.status != "ok":
                    raise RuntimeError(f"fleet request ended {result.status}: {result.error}")
                route = result.route
                return _Served(
                    result.usage.completion_tokens,
                    sent,
                    route.started_at if route else None,
                    route.finished_at if route else sent,
                    time.time(),
                )
            if frame.type == "error":
                raise RuntimeError(f"fleet request failed: {frame.error}")
    raise RuntimeError("fleet token stream ended without a result")


async def _timed(work: Callable[[], Awaitable[list[T]]]) -> tuple[list[T], float]:
    started = time.perf_counter()
    done = await work()
    return done, time.perf_counter() - started


async def _bench(
    fleet: Fleet, rounds: int, n: int, max_tokens: int, engine_kind: str, concurrency: int
) -> EngineBench:
    raw = make_engine(engine_kind)
    # Loads on this loop while the worker loads its own engine; then the worker's ready.
    await raw.start()
    try:
        await fleet.wait_ready(READY_TIMEOUT)
        async with await connect(Settings(nats_url=fleet.nats_url), "sy-bench-engine") as bus:
            return await _rounds(raw, bus, rounds, n, max_tokens, engine_kind, concurrency)
    finally:
        # The worker stops (in a thread) while the raw engine shuts down on this loop.
        stopping = asyncio.ensure_future(fleet.stop())
        await asyncio.sleep(0)
        await raw.close()
        await stopping


async def _rounds(
    raw: EngineProtocol, bus: Bus, rounds: int, n: int, max_tokens: int, engine_kind: str,
    concurrency: int,
) -> EngineBench:  # fmt: skip
    raw_rates: list[float] = []
    fleet_rates: list[float] = []
    raw_tokens: list[int] = []
    fleet_tokens: list[int] = []
    overheads: list[float] = []
    served: list[_Served] = []
    raw_walls: list[float] = []
    settle = SETTLE_S.get(engine_kind, 0.0)
    for rnd in range(rounds + 1):  # round 0 warms both paths up and is not counted
        reqs = _requests(n, max_tokens, rnd)
        raw_work = partial(_spread, reqs, concurrency, lambda r: _raw_one(raw, r))
        fleet_work = partial(_spread, reqs, concurrency, lambda r: _served_one(bus, r))
        # The paths take turns going first, so a round starts on the path the last ended
        # on: only the switch within a round waits for the idle engine to settle.
        if rnd % 2 == 0:
            ran, raw_s = await _timed(raw_work)
            await asyncio.sleep(settle)
            done, fleet_s = await _timed(fleet_work)
        else:
            done, fleet_s = await _timed(fleet_work)
            await asyncio.sleep(settle)
            ran, raw_s = await _timed(raw_work)
        if rnd == 0:
            continue
        raw_tokens.append(sum(tokens for tokens, _ in ran))
        raw_walls += [wall for _, wall in ran]
        fleet_tokens.append(sum(s.tokens for s in done))
        raw_rates.append(raw_tokens[-1] / raw_s)
        fleet_rates.append(fleet_tokens[-1] / fleet_s)
        overheads.append((fleet_s - raw_s) / n * 1000)
        served += done
    raw_med, fleet_med = statistics.median(raw_rates), statistics.median(fleet_rates)
    return EngineBench(
        engine=engine_kind,
        concurrency=concurrency,
        rounds=rounds,
        requests_per_round=n,
        max_tokens=max_tokens,
        raw_tokens_per_s=round(raw_med, 2),
        fleet_tokens_per_s=round(fleet_med, 2),
        ratio=round(fleet_med / raw_med, 4),
        raw_rounds=[round(r, 2) for r in raw_rates],
        fleet_rounds=[round(r, 2) for r in fleet_rates],
        raw_round_tokens=raw_tokens,
        fleet_round_tokens=fleet_tokens,
        fleet_overhead_ms_per_request=round(statistics.median(overheads), 2),
        fleet_hops_ms=_hops(served),
        raw_request_ms=round(statistics.median(raw_walls) * 1000, 2),
    )


def _hops(served: list[_Served]) -> dict[str, float]:
    started = [s for s in served if s.started is not None]
    if not started:
        return {}

    def med(values: list[float]) -> float:
        return round(statistics.median(values) * 1000, 2)

    return {
        "to_worker": med([cast(float, s.started) - s.sent for s in started]),
        "on_engine": med([s.finished - cast(float, s.started) for s in started]),
        "to_client": med([s.received - s.finished for s in started]),
    }


def run_engine_bench(
    *,
    nats_url: str | None,
    rounds: int,
    requests: int,
    max_tokens: int,
    engine: str = "llamacpp",
    concurrency: int = 1,
) -> EngineBench:
    # One worker owning every partition itself: no router between the client and it, and
    # credit enough to pull all `concurrency` requests at once whichever partitions they
    # hash to. An unknown engine stops that worker at start, and the launch reports its log.
    kind = cast(Engine, engine)
    credit = {"SY_CREDIT": str(max(4, concurrency))}
    spec = FleetSpec(
        pools=(Pool(POOL, env=credit),), engine=kind, partitions=PARTITIONS, services=()
    )
    # Not waiting for the worker here: the raw engine loads meanwhile, then waits for it.
    with launch(spec, nats_url=nats_url, ready_timeout=None) as fleet:
        return eventloop.run(_bench(fleet, rounds, requests, max_tokens, engine, concurrency))
