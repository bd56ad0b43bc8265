"""`sy bench load` for real: no coordinated omission against a server that stalls, and a
short sweep of an in-process fleet of 8 `sim` workers that finds its knee."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from switchyard.bench.arrival import Arrival
from switchyard.bench.loadgen import LoadConfig, Record, run_load
from switchyard.bench.loadstats import Slo, summarise
from switchyard.bench.loadsweep import SweepConfig, run_sweep
from switchyard.bench.loadtargets import EdgeTarget
from switchyard.bench.workloads import ChatShape, Workload
from switchyard.config import Settings
from switchyard.ports import free_port
from tests.support.loopthread import in_thread
from tests.support.poll import until

STALL_S = 2.0
STALL_AT = 2.0  # run seconds


class StallingChat:
    """An OpenAI-style streaming chat endpoint that serves one request at a time (a single
    engine slot) in 5 ms, except that request number `stall_index` (the workload writes
    `#<index>]` into each prompt) holds the slot for `STALL_S`: everything due meanwhile
    queues behind it. By index, not by clock, so a busy machine cannot shift the window."""

    def __init__(self, stall_index: int) -> None:
        self.lock = asyncio.Lock()
        self.stall_index = stall_index

    async def chat(self, request: Request) -> StreamingResponse:
        body = await request.json()
        found = re.search(r"#(\d+)\]", body["messages"][-1]["content"])
        assert found is not None
        async with self.lock:
            if int(found.group(1)) == self.stall_index:
                await asyncio.sleep(STALL_S)
            await asyncio.sleep(0.005)

        async def events() -> AsyncIterator[str]:
            yield 'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
            for _ in range(body["max_tokens"]):
                yield 'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
            yield 'data: {"choices":[{"delta":{},"finish_reason":"length"}]}\n\n'
            usage = {"prompt_tokens": 10, "completion_tokens": body["max_tokens"]}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


@contextlib.asynccontextmanager
async def serving(app: StallingChat) -> AsyncIterator[str]:
    port = free_port()
    starlette = Starlette(routes=[Route("/v1/chat/completions", app.chat, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(starlette, host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))  # fmt: skip
    task = asyncio.create_task(server.serve())
    await until(lambda: server.started or task.done(), timeout=30, what="the server listening")
    assert server.started, task
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def _run(arrival: Arrival, duration: float, stall_index: int) -> list[Record]:
    app = StallingChat(stall_index)
    async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        cfg = LoadConfig(arrival, duration_s=duration, warmup_s=0.0, seed=1, request_timeout_s=20)
        shape = ChatShape(input_median=8, output_median=4, output_sigma=0)
        return await run_load(EdgeTarget(http), Workload("chat", seed=1, chat=shape), cfg)


async def test_a_stall_shows_in_the_requests_due_during_it() -> None:
    # At 40 req/s, constant, request 80 is due at 2.0 s (STALL_AT).
    recs = await _run(Arrival("constant", rate=40), duration=5.0, stall_index=80)
    assert all(r.ok for r in recs), {r.outcome for r in recs}
    # The harness kept its schedule although a quarter of the run was stuck behind the stall.
    # Had it waited on the stalled requests, the 80 due during the stall (40 % of the run)
    # would have been sent up to 2 s late: p75 of the lag ~0.75 s, p99 ~1.9 s. A pause of
    # the shared machine itself (0.55 s seen once in CI) delays the few due in it.
    lags = sorted(r.send_lag or 0 for r in recs)
    assert lags[int(0.75 * len(lags))] < 0.1, lags[-10:]
    assert lags[int(0.99 * len(lags))] < STALL_S / 2, lags[-10:]
    during = [r for r in recs if STALL_AT + 0.1 <= r.intended <= STALL_AT + STALL_S - 0.1]
    assert len(during) >= 60
    for r in during:  # each waited from its due time until the stall ended
        assert r.e2e is not None
        assert r.e2e >= (STALL_AT + STALL_S - r.intended) - 0.15, (r.intended, r.e2e)
    stats = summarise(recs, label="stall", load=40, open_loop=True, warmup_s=0.0, duration_s=5.0,
                      slo=Slo())  # fmt: skip
    assert stats.e2e_ms.p99 >= 1500
    assert stats.e2e_ms.p90 >= 700  # a fifth of the requests were due during the stall
    assert stats.ttft_ms.p99 >= 1500
    before = [r.e2e or 0 for r in recs if r.intended < STALL_AT - 0.3]
    assert max(before) < 0.5  # the stall did not leak backwards: the numbers are per request


async def test_a_closed_loop_hides_the_same_stall() -> None:
    # The contrast the report warns about: one user waits out the stall once, then carries on;
    # what it would have sent meanwhile was never due, so almost nothing looks slow.
    recs = await _run(Arrival("closed", concurrency=1), duration=5.0, stall_index=80)
    slow = [r for r in recs if (r.e2e or 0) > 0.5]
    assert len(slow) == 1 and len(recs) > 100
    stats = summarise(recs, label="closed", load=1, open_loop=False, warmup_s=0.0,
                      duration_s=5.0, slo=Slo())  # fmt: skip
    assert stats.e2e_ms.p99 < 500


# --- a sweep of an in-process sim fleet (8 workers) ------------------------------------------

WORKERS = 8
PARTITIONS = 64


@contextlib.contextmanager
def sim_fleet(nats_url: str, pool: str, policy: Path) -> Iterator[None]:
    """Router, 8 sim workers and the preprocessor on their own event loop in a thread, so
    the synchronous `run_sweep` can drive them from this one."""
    from switchyard.bus.connection import connect
    from tests.support.fleet import (
        preprocessor_in_process,
        provision_pool,
        router_in_process,
        wait_for_pool,
        worker_in_process,
    )

    @contextlib.asynccontextmanager
    async def fleet() -> AsyncIterator[None]:
        bus = await connect(Settings(nats_url=nats_url), "load-fleet-setup")
        await provision_pool(bus.js, pool, partitions=PARTITIONS)
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(router_in_process(
                nats_url, partitions=PARTITIONS, pools=[pool], tenant_policy=policy,
                rebalance_interval=0.2))  # fmt: skip
            for i in range(WORKERS):
                await stack.enter_async_context(worker_in_process(
                    nats_url, pool=pool, engine="sim", assignment="kv", partitions=PARTITIONS,
                    worker_id=f"{pool}-w{i}", heartbeat_interval=0.3))  # fmt: skip
            await stack.enter_async_context(preprocessor_in_process(nats_url, chat_pool=pool))
            await wait_for_pool(bus.js, pool, WORKERS, PARTITIONS)
            await bus.close()
            yield

    with in_thread(fleet, name=f"load-fleet-{pool}"):
        yield


def test_sweep_of_a_sim_fleet_finds_its_knee(
    nats_url: str, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One sequence per simulated GPU at 8x wall time: the 8-engine fleet saturates near
    # 8 / (8 x ~0.23 s) ~ 4 req/s, far below what this machine's CPU limits the harness
    # to even when it is busy, so the knee is the simulated fleet's, not the box's.
    monkeypatch.setenv("SY_SIM_MAX_NUM_SEQS", "1")
    monkeypatch.setenv("SY_SIM_DELAY_SCALE", "8")
    policy = tmp_path / "tenants.yaml"
    policy.write_text(yaml.safe_dump({"default": {
        "itpm": 10**12, "otpm": 10**12, "max_concurrency": 10**6,
        "max_queued_tokens": 10**12}}))  # fmt: skip
    pool = f"load{unique}"
    out = tmp_path / "report"
    cfg = SweepConfig(
        loads=(2, 4, 8, 16), target="nats", nats_url=nats_url, workload="chat",
        arrival="constant", duration_s=4.0, warmup_s=1.0, seed=3, request_timeout_s=30,
        slo=Slo(ttft_ms=2000, tpot_ms=200), replicas=WORKERS, gpu_price_per_hour=2.0,
        fleet=f"{WORKERS} in-process sim workers", tenants={"chat": f"t{unique}"},
        chat=ChatShape(input_median=64, output_median=16, output_sigma=0.3, conversations=4096),
        pause_s=0.5,
        # 4-second windows on a shared 2-core box: a saturated step's throughput still
        # moves by up to ~15 % (more of the 8 workers get work as the offer grows), so
        # this sweep asks for under 20 % (the CLI's default is 5 %); p99 must still +50 %.
        knee_min_gain=0.2,
    )  # fmt: skip
    with sim_fleet(nats_url, pool, policy):
        result = run_sweep(cfg, out)

    runs = {r.load: r for r in result.runs}
    table = [(r.load, r.throughput_rps, r.e2e_ms.p99) for r in result.runs]
    print("load, req/s, p99 ms:", table)  # shown with -s, and on a failure
    light = runs[2]
    assert light.errors == {} and light.ok == light.requests > 0
    assert light.throughput_rps == pytest.approx(2, rel=0.6)  # below capacity: ~as offered
    assert light.ttft_ms.p50 > 0 and light.output_tokens_per_s > 0
    # The sim's modelled decode step at batch 1 is ~13 ms; at 8x wall time, ~104 ms a token.
    assert 80 < light.tpot_ms.p50 < 160
    knee = result.knee
    assert knee is not None, table
    assert knee.load in (4, 8, 16)
    at = runs[knee.load]
    assert at.throughput_rps < 0.8 * knee.load  # saturated: it served well below the offer
    # Against the light step's median, not its p99: that step has 8 samples, so its "p99"
    # is its single slowest request, and one unlucky collision on a 1-slot worker (seen
    # in CI: 6.9 s) made it as slow as a saturated step's tail.
    assert at.e2e_ms.p99 > 2 * light.e2e_ms.p50
    assert at.goodput_rps <= at.throughput_rps
    assert result.operating is not None and result.operating.load <= knee.recommended_limit

    report = (out / "report.md").read_text()
    assert "Safe concurrency per replica" in report and "Cost per 1,000 requests" in report
    data = json.loads((out / "sweep.json").read_text())
    assert data["knee"]["load"] == knee.load and len(data["runs"]) == 4
    for png in ("throughput.png", "p99.png", "cdf.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
