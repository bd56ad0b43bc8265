"""Kill -9 a worker with requests in flight: every request is answered exactly once."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter

from nats.aio.msg import Msg

from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.bus.topology import ASSIGNMENTS_BUCKET
from switchyard.codec import decode, encode
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
from tests.support.fleet import provision_pool, work_subject, worker_process
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
