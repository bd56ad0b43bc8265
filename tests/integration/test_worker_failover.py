"""Kill -9 a worker with requests in flight: every request is answered exactly once."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import yaml
from nats.aio.msg import Msg

from services.worker.runner import Runner
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.bus.topology import ASSIGNMENTS_BUCKET, TopologySettings
from switchyard.codec import decode, encode
from switchyard.engines.base import Delta, EngineRequest
from switchyard.engines.sim import SimEngine, SimSettings
from switchyard.fleet.readiness import PoolReady, wait_for_pools
from switchyard.messages.fleet import Assignment, assignment_key
from switchyard.messages.inference import (
    ChatMessage,
    GenerateRequest,
    GenerateResult,
    Sampling,
    TokenFrame,
)
from switchyard.partition import partition
from tests.support.fleet import (
    provision_pool,
    router_in_process,
    service_process,
    wait_for_pool,
    work_subject,
    worker_process,
)
from tests.support.poll import until


async def _assign(bus: Bus, pool: str, owners: dict[int, str]) -> None:
    """What the router would write: here the test plays the router."""
    kv = await bus.js.key_value(ASSIGNMENTS_BUCKET)
    for p, worker in owners.items():
        value = Assignment(pool=pool, partition=p, worker=worker, at=time.time(), reason="dead")
        await kv.put(assignment_key(pool, p), encode(value))


async def test_kill_9_mid_flight_loses_nothing_and_answers_once(
    bus: Bus, unique: str, nats_url: str
) -> None:
    pool, tenant = f"f{unique}", f"t{unique}"
    await provision_pool(bus.js, pool, partitions=4, ack_wait=2.0)
    a, b = f"wa{unique}", f"wb{unique}"
    await _assign(bus, pool, {0: a, 1: a, 2: b, 3: b})
    env = {
        "SY_ASSIGNMENT": "kv", "SY_POOL": pool, "SY_ENGINE": "sim", "SY_PARTITIONS": "4",
        "SY_WORK_ACK_WAIT": "2", "SY_HEARTBEAT_INTERVAL": "0.5",
    }  # fmt: skip
    terminal: Counter[str] = Counter()
    results: Counter[str] = Counter()
    streaming: set[str] = set()  # requests that have streamed a token

    async def on_res(msg: Msg) -> None:
        results[decode(msg.data, GenerateResult).request_id] += 1

    res_sub = await bus.js.subscribe(f"res.llm.{tenant}", cb=on_res, ordered_consumer=True)
    with (
        worker_process(nats_url, SY_WORKER_ID=a, **env) as proc_a,
        worker_process(nats_url, SY_WORKER_ID=b, **env) as proc_b,
    ):

        def alive() -> None:
            proc_a.check()
            proc_b.check()

        # Both heartbeat and bind the partitions assigned to them above.
        ready = PoolReady(pool, 2, 4, worker_ids=(a, b))
        await wait_for_pools(bus.js, [ready], timeout=60, check=alive)
        sessions = [f"s{i}" for i in range(200)]
        on_a = [s for s in sessions if partition(s, 4) in (0, 1)][:10]
        on_b = [s for s in sessions if partition(s, 4) in (2, 3)][:10]
        reqs = []
        for session in on_a + on_b:
            req = GenerateRequest(
                tenant=tenant, workload="llm", pool=pool, session=session,
                messages=[ChatMessage(role="user", content=f"step of {session}")],
                sampling=Sampling(max_tokens=150, temperature=0.0, seed=1),
            )  # fmt: skip
            inbox = bus.nc.new_inbox()

            async def on_frame(msg: Msg, rid: str = req.id) -> None:
                if decode(msg.data, TokenFrame).type != "delta":
                    terminal[rid] += 1
                else:
                    streaming.add(rid)

            await bus.nc.subscribe(inbox, cb=on_frame)
            reqs.append(req)
            await publish(bus.js, work_subject(req), req.model_copy(update={"reply": inbox}))

        def generating(on: list[GenerateRequest]) -> bool:
            return any(r.id in streaming for r in on)

        # Kill A mid-flight: both workers are generating (150 tokens take seconds).
        await until(lambda: generating(reqs[: len(on_a)]) and generating(reqs[len(on_a) :]),
                    timeout=60, what="both workers generating")  # fmt: skip
        proc_a.proc.send_signal(signal.SIGKILL)
        proc_a.proc.wait(10)
        await _assign(bus, pool, {0: b, 1: b})  # what the router does when A's heartbeat expires
        await until(lambda: len(results) >= len(reqs), timeout=60, what="every request answered")
        await asyncio.sleep(3.0)  # room for any duplicate to show up
    await res_sub.unsubscribe()
    ids = {r.id for r in reqs}
    assert set(results) == ids, f"lost: {ids - set(results)}"
    assert all(n == 1 for n in results.values()), results
    assert set(terminal) == ids and all(n == 1 for n in terminal.values()), terminal


async def test_a_dead_workers_requests_run_again_within_the_heartbeat_ttl(
    bus: Bus, unique: str, nats_url: str, tmp_path: Path
) -> None:
    """Issue #24: with the real router and the default WORK ack wait, the requests a worker
    held when it was killed reach the survivor within the heartbeat TTL + 3 s of the kill
    (before: after the 30 s ack wait), each answered exactly once."""
    pool, tenant, parts = f"fo{unique}", f"t{unique}", 8
    topo = TopologySettings()
    await provision_pool(bus.js, pool, partitions=parts, ack_wait=topo.work_ack_wait)
    policy = tmp_path / "tenants.yaml"
    policy.write_text(yaml.safe_dump({
        "default": {"itpm": 10**9, "otpm": 10**8, "max_queued_tokens": 10**9},
    }))  # fmt: skip
    env = {
        "SY_ASSIGNMENT": "kv", "SY_POOL": pool, "SY_ENGINE": "sim", "SY_PARTITIONS": str(parts),
        "SY_SIM_DELAY_SCALE": "1",
    }  # fmt: skip
    results: Counter[str] = Counter()

    async def on_res(msg: Msg) -> None:
        results[decode(msg.data, GenerateResult).request_id] += 1

    res_sub = await bus.js.subscribe(f"res.llm.{tenant}", cb=on_res, ordered_consumer=True)
    streaming: set[str] = set()
    answered: dict[str, tuple[float, GenerateResult]] = {}

    async def ask(req: GenerateRequest) -> None:
        async with TokenStreamReader(bus.nc, idle_timeout=120) as reader:
            await publish(
                bus.js, f"req.llm.{tenant}", req.model_copy(update={"reply": reader.inbox})
            )
            async for frame in reader:
                if frame.type == "delta":
                    streaming.add(req.id)
                elif frame.result is not None:
                    answered[req.id] = (time.monotonic(), frame.result)

    async with router_in_process(
        nats_url, partitions=parts, pools=[pool], tenant_policy=policy, rebalance_interval=0.2
    ):  # fmt: skip
        a, b = f"{pool}-w0", f"{pool}-w1"
        with (
            service_process("worker", nats_url, SY_WORKER_ID=a, **env) as doomed,
            service_process("worker", nats_url, SY_WORKER_ID=b, **env),
        ):
            await wait_for_pool(bus.js, pool, 2, parts)
            sampling = Sampling(max_tokens=250, temperature=0.0, seed=1)
            reqs = [
                GenerateRequest(
                    tenant=tenant,
                    workload="llm",
                    pool=pool,
                    sampling=sampling,
                    prompt_tokens=8,
                    messages=[ChatMessage(role="user", content=f"question {i}")],
                )
                for i in range(24)
            ]
            asking = [asyncio.create_task(ask(r)) for r in reqs]
            # 250 tokens take the sim ~4 s: kill A once most requests are mid-answer.
            await until(lambda: len(streaming) >= 20, timeout=60, what="requests streaming")
            doomed.proc.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            doomed.proc.wait(10)
            await asyncio.wait_for(asyncio.gather(*asking), 120)
            await asyncio.sleep(2.0)  # room for a duplicate answer to show up on RES
    await res_sub.unsubscribe()
    assert set(answered) == {r.id for r in reqs}
    assert all((result.status == "ok" and result.worker == b) or result.worker == a
               for _, result in answered.values())  # fmt: skip
    held = [rid for rid, (_, result) in answered.items() if result.worker == b
            and result.route is not None and result.route.routed_to == a]  # fmt: skip
    assert held, "the killed worker held no request: the test proved nothing"
    waits = sorted(answered[rid][0] - killed_at for rid in held)
    assert waits[-1] <= topo.heartbeat_ttl + 3.0, waits
    assert all(n == 1 for n in results.values()) and set(results) == set(answered), results


async def test_a_request_delivered_again_while_it_runs_is_run_once(bus: Bus, unique: str) -> None:
    """WORK's ack wait is short (5 s): a keepalive that comes late redelivers a request its
    worker still runs. The second delivery waits for the first run and is settled with it:
    the engine runs it once and it is answered once."""
    pool, tenant = f"rd{unique}", f"t{unique}"
    await provision_pool(bus.js, pool)
    runs: list[str] = []

    class Counting(SimEngine):
        async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
            runs.append(request.request_id)
            async for delta in super().generate(request):
                yield delta

    engine = Counting(SimSettings(delay_scale=1.0))
    await engine.start()
    answers: Counter[str] = Counter()

    async def on_res(msg: Msg) -> None:
        answers[decode(msg.data, GenerateResult).request_id] += 1

    res_sub = await bus.nc.subscribe(f"res.llm.{tenant}", cb=on_res)
    try:
        runner = Runner(bus.nc, bus.js, engine, f"{pool}-w0")
        req = GenerateRequest(
            tenant=tenant, workload="llm", pool=pool,
            messages=[ChatMessage(role="user", content="a question")],
            sampling=Sampling(max_tokens=40, temperature=0.0, seed=1),
        )  # fmt: skip
        first = asyncio.create_task(runner.handle(req, attempt=1))
        await until(lambda: req.id in runner.running, timeout=10, what="the first run")
        await runner.handle(req, attempt=2)  # returns once the first run has answered
        assert first.done() and first.exception() is None
        await until(lambda: answers[req.id] >= 1, timeout=10, what="the answer on RES")
        await asyncio.sleep(0.5)  # room for a second answer to show up
    finally:
        await res_sub.unsubscribe()
        await engine.close()
    assert runs == [req.id] and answers == Counter({req.id: 1}) and not runner.handling
