"""`sy bench edge`: what the HTTP edge adds over publishing the same chat request straight
onto NATS.

Both paths end in the same fleet (router -> worker with the `sim` engine at
zero delay, all on one event loop in this process, on an embedded or given NATS):

- direct: a `ChatRequest` published as the edge publishes it (`chatprep.prepared_sends`:
  prepared onto `req.llm.<tenant>`, recorded on `llm.edge.<tenant>`) with a reply inbox,
  read to its end frame - what the edge itself does for a request;
- edge: `POST /v1/chat/completions` (non-streaming) over HTTP to the edge under uvicorn.

The requests of both paths are interleaved (alternating in one job queue drained by a fixed
number of concurrent clients), so both see the same fleet load and machine noise. Latency is
wall time per request from send to the full answer; the difference of the percentiles is the
edge + HTTP overhead. The load generator shares the process, so absolute numbers include its
CPU; the difference is what the edge adds on top.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any

from switchyard import eventloop
from switchyard.bench.engine import numbered_messages
from switchyard.bench.stats import Report, percentile
from switchyard.bus.connection import Bus, connect
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.chatprep import prepared_sends
from switchyard.config import Settings
from switchyard.fleet import UNMETERED, Edge, FleetError, FleetSpec, Pool, env_of, launch
from switchyard.fleet.launch import Launch
from switchyard.messages.inference import ChatMessage, ChatRequest, Sampling

POOL = "benchedge"
PARTITIONS = 4
TENANT = "bench"
KEY = "sk-bench-edge"  # a throwaway key for this run's private edge


@dataclass
class EdgeBench(Report):
    requests_per_path: int
    concurrency: int
    max_tokens: int
    direct_p50_ms: float
    direct_p99_ms: float
    edge_p50_ms: float
    edge_p99_ms: float
    added_p50_ms: float  # edge - direct
    added_p99_ms: float
    direct_mean_ms: float
    edge_mean_ms: float
    wall_s: float
    errors: int


async def _direct(bus: Bus, i: int, max_tokens: int) -> None:
    req = ChatRequest(
        tenant=TENANT,
        model="default",
        messages=[ChatMessage.model_validate(m) for m in numbered_messages(i)],
        sampling=Sampling(max_tokens=max_tokens, temperature=0.0),
        stream=False,
        deadline=time.time() + 120,
    )
    async with TokenStreamReader(bus.nc, idle_timeout=60) as reader:
        sent = req.model_copy(update={"reply": reader.inbox})
        await asyncio.gather(*(publish(bus.js, s, m) for s, m in prepared_sends(sent, POOL)))
        async for frame in reader:
            if frame.type == "error" or (frame.type == "end" and frame.result is None):
                raise RuntimeError(f"direct request failed: {frame.error}")
            if frame.type == "end" and frame.result and frame.result.status != "ok":
                raise RuntimeError(f"direct request {frame.result.status}")


async def _edge(http: Any, i: int, max_tokens: int) -> None:
    body = {"model": "default", "messages": numbered_messages(i), "max_tokens": max_tokens,
            "temperature": 0}  # fmt: skip
    r = await http.post("/v1/chat/completions", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"edge request failed: {r.status_code} {r.text[:200]}")


def _fleet(nats_url: str | None) -> Launch:
    """Router, sim worker (zero delay) and edge on this loop, on `nats_url`
    or an embedded NATS; ready once every partition is bound and the edge answers."""
    spec = FleetSpec(
        pools=(Pool(POOL, env=env_of(sim_delay_scale=0)),), engine="sim", partitions=PARTITIONS,
        services=("router",), tenant_policy=UNMETERED, edge=Edge(keys={KEY: TENANT}),
        env=env_of(chat_pool=POOL),
        heartbeat_interval=0.3, rebalance_interval=0.2,
    )  # fmt: skip
    return launch(spec, mode="inproc", nats_url=nats_url)


async def _bench(
    nats_url: str | None, requests: int, concurrency: int, max_tokens: int
) -> EdgeBench:
    import httpx

    async with _fleet(nats_url) as fleet:
        url = fleet.edge_url
        if url is None:
            raise FleetError("the bench fleet was launched without its edge")
        client = await connect(Settings(nats_url=fleet.nats_url), "sy-bench-edge-client")
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(
            base_url=url, headers=headers, limits=limits, timeout=120
        ) as http:
            times: dict[str, list[float]] = {"direct": [], "edge": []}
            errors = 0

            async def one(path: str, i: int) -> float:
                started = time.perf_counter()
                if path == "edge":
                    await _edge(http, i, max_tokens)
                else:
                    await _direct(client, i, max_tokens)
                return time.perf_counter() - started

            async def drain(jobs: list[tuple[str, int]], record: bool) -> None:
                nonlocal errors
                queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
                for job in jobs:
                    queue.put_nowait(job)

                async def runner() -> None:
                    nonlocal errors
                    while not queue.empty():
                        path, i = queue.get_nowait()
                        try:
                            took = await one(path, i)
                        except Exception:
                            errors += record
                            continue
                        if record:
                            times[path].append(took)

                await asyncio.gather(*(runner() for _ in range(concurrency)))

            # Alternate the paths job by job: both always share the fleet and the clients.
            def jobs(n: int, offset: int) -> list[tuple[str, int]]:
                return [(p, offset + i) for i in range(n) for p in ("direct", "edge")]

            warm = max(concurrency * 2, requests // 10)
            await drain(jobs(warm, 0), record=False)
            started = time.perf_counter()
            await drain(jobs(requests, warm), record=True)
            wall = time.perf_counter() - started
        await client.close()
    d, e = [t * 1000 for t in times["direct"]], [t * 1000 for t in times["edge"]]
    if not d or not e:
        raise RuntimeError(f"no successful requests ({errors} errors)")
    return EdgeBench(
        requests_per_path=requests,
        concurrency=concurrency,
        max_tokens=max_tokens,
        direct_p50_ms=round(percentile(d, 0.5), 2),
        direct_p99_ms=round(percentile(d, 0.99), 2),
        edge_p50_ms=round(percentile(e, 0.5), 2),
        edge_p99_ms=round(percentile(e, 0.99), 2),
        added_p50_ms=round(percentile(e, 0.5) - percentile(d, 0.5), 2),
        added_p99_ms=round(percentile(e, 0.99) - percentile(d, 0.99), 2),
        direct_mean_ms=round(statistics.fmean(d), 2),
        edge_mean_ms=round(statistics.fmean(e), 2),
        wall_s=round(wall, 2),
        errors=errors,
    )


def run_edge_bench(
    *, nats_url: str | None, requests: int = 400, concurrency: int = 8, max_tokens: int = 16
) -> EdgeBench:
    return eventloop.run(_bench(nats_url, requests, concurrency, max_tokens))
