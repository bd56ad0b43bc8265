"""`sy bench engine`: the raw llama.cpp engine against the same requests served by a
worker over NATS, interleaved round by round so machine noise hits both alike."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass
from typing import cast

from switchyard import subjects
from switchyard.bus.connection import connect
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.config import Settings
from switchyard.engines.base import EngineRequest
from switchyard.engines.factory import make_engine
from switchyard.fleet import FleetSpec, Pool, launch
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


@dataclass
class EngineBench:
    engine: str
    rounds: int
    requests_per_round: int
    max_tokens: int
    raw_tokens_per_s: float  # median over rounds
    fleet_tokens_per_s: float
    ratio: float  # fleet / raw
    raw_rounds: list[float]
    fleet_rounds: list[float]
    fleet_overhead_ms_per_request: float  # median extra wall time per request

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


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


async def _bench(
    nats_url: str, rounds: int, n: int, max_tokens: int, engine_kind: str
) -> EngineBench:
    bus = await connect(Settings(nats_url=nats_url), "sy-bench-engine")
    raw = make_engine(engine_kind)
    await raw.start()
    raw_rates: list[float] = []
    fleet_rates: list[float] = []
    overheads: list[float] = []
    try:
        for rnd in range(rounds + 1):  # round 0 warms both paths up and is not counted
            reqs = _requests(n, max_tokens, rnd)
            started = time.perf_counter()
            tokens = 0
            for req in reqs:
                async for delta in raw.generate(EngineRequest.from_generate(req)):
                    if delta.finish_reason is not None:
                        tokens += delta.completion_tokens
            raw_s = time.perf_counter() - started
            started = time.perf_counter()
            fleet_tokens = 0
            for req in reqs:
                key = req.session or req.tenant
                async with TokenStreamReader(bus.nc, idle_timeout=120) as reader:
                    sent = req.model_copy(update={"reply": reader.inbox, "id": req.id + "f"})
                    await publish(bus.js, subjects.work(POOL, partition(key, PARTITIONS)), sent)
                    async for frame in reader:
                        if frame.type == "end" and frame.result:
                            fleet_tokens += frame.result.usage.completion_tokens
                        elif frame.type == "error":
                            raise RuntimeError(f"fleet request failed: {frame.error}")
            fleet_s = time.perf_counter() - started
            if rnd == 0:
                continue
            raw_rates.append(tokens / raw_s)
            fleet_rates.append(fleet_tokens / fleet_s)
            overheads.append((fleet_s - raw_s) / n * 1000)
    finally:
        await raw.close()
        await bus.close()
    raw_med, fleet_med = statistics.median(raw_rates), statistics.median(fleet_rates)
    return EngineBench(
        engine=engine_kind,
        rounds=rounds,
        requests_per_round=n,
        max_tokens=max_tokens,
        raw_tokens_per_s=round(raw_med, 2),
        fleet_tokens_per_s=round(fleet_med, 2),
        ratio=round(fleet_med / raw_med, 4),
        raw_rounds=[round(r, 2) for r in raw_rates],
        fleet_rounds=[round(r, 2) for r in fleet_rates],
        fleet_overhead_ms_per_request=round(statistics.median(overheads), 2),
    )


def run_engine_bench(
    *, nats_url: str | None, rounds: int, requests: int, max_tokens: int, engine: str = "llamacpp"
) -> EngineBench:
    # One worker owning every partition itself: no router between the client and it. An
    # unknown engine stops that worker at start, and the launch reports its log.
    kind = cast(Engine, engine)
    spec = FleetSpec(pools=(Pool(POOL),), engine=kind, partitions=PARTITIONS, services=())
    with launch(spec, nats_url=nats_url) as fleet:
        return asyncio.run(_bench(fleet.nats_url, rounds, requests, max_tokens, engine))
