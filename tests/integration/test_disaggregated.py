"""A disaggregated agent pool on real NATS (#39): a `prefill` and a `decode` sim worker.

The router sends a step to the prefill worker (its session's, for the prefix cache),
which computes the prompt's KV and one token and hands the decode stage back on REQ; the
router places that on the decode worker (sticky per session too), which moves the KV
(modelled: the bytes over the link) instead of computing it, and answers. The phone sees
one answer per step, from the decode worker. A colocated worker beside them is the
control: the same step prefilled there costs the frame's compute. The drill kills -9 a
prefill and a decode worker under load: nothing is lost, nothing answered twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import yaml
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from prometheus_client import REGISTRY

from switchyard.bench.agentsim import AgentSimConfig, play, summarise
from switchyard.bench.stats import percentile
from switchyard.bus.connection import Bus, connect
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.bus.topology import TopologySettings
from switchyard.capacity.calibration import sim_decode_seconds
from switchyard.codec import decode
from switchyard.config import Settings
from switchyard.engines.sim import SimSettings
from switchyard.ids import new_id
from switchyard.messages.inference import ChatMessage, GenerateRequest, GenerateResult, Sampling
from tests.support.fleet import (
    preprocessor_in_process,
    provision_pool,
    router_in_process,
    service_process,
    wait_for_pool,
    worker_in_process,
)
from tests.support.poll import until

CFG = AgentSimConfig(
    engine="sim", workers=2, width=1280, height=720, stale_after=30.0, frame_pool=2,
    delay_scale=1.0, action_format="compact", act_ms=50,
)  # fmt: skip


def handoffs() -> float:
    return REGISTRY.get_sample_value("sy_worker_handoff_requests_total") or 0.0


@contextlib.asynccontextmanager
async def agent_pool(
    nats_url: str, roles: tuple[str, ...], topologies: tuple[str, ...] = ()
) -> AsyncIterator[str]:
    """Router, preprocessor and one sim worker per role (at `topologies`, one each, or at
    the host's name) for a private pool; its name."""
    pool = f"pd{new_id().lower()[-10:]}"
    bus = await connect(Settings(nats_url=nats_url), "pytest-pd")
    await provision_pool(bus.js, pool)
    try:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(
                router_in_process(nats_url, partitions=4, pools=[pool], rebalance_interval=0.2)
            )
            for i, role in enumerate(roles):
                at = {"worker_topology": topologies[i]} if topologies else {}
                await stack.enter_async_context(
                    worker_in_process(nats_url, pool=pool, engine="sim", assignment="kv",
                                      worker_id=f"{pool}-w{i}", worker_role=role, **at)
                )  # fmt: skip
            await stack.enter_async_context(
                preprocessor_in_process(nats_url, agent_pool=pool, frame_procs=0)
            )
            await wait_for_pool(bus.js, pool, len(roles))
            yield pool
    finally:
        await bus.close()


def moved_prompt_bound() -> float:
    """The most a decode stage's modelled "prefill" (its arrival's step boundary -> first
    token) can take on the sim's default card when nothing is computed: the step it waits
    for, the step that samples its first token, and 20,000 tokens of KV over the link (more
    than a step's prompt here). A colocated 1280x720 step prefills for far longer: ~95 ms
    of encoder and ~80 ms of LLM prefill (capacity/calibration.py's table)."""
    s = SimSettings()
    return 2 * sim_decode_seconds(s, 2) + 20_000 * s.kv_bytes_per_token / (s.kv_link_gbs * 1e9)


async def test_a_step_runs_its_prefill_and_decode_on_two_workers(nats_url: str) -> None:
    before = handoffs()
    async with agent_pool(nats_url, ("prefill", "decode")) as pool:
        cfg = replace(CFG, nats_url=nats_url, tenant=f"pd{new_id().lower()[-8:]}",
                      phones=2, steps=3)  # fmt: skip
        played = await play(cfg, nats_url)
    recs = played.records
    assert [r.status for r in recs] == ["ok"] * 6, [(r.status, r.code) for r in recs]
    assert all(r.valid and r.executed for r in recs)
    # Every answer came from the decode worker, each step prefilled once on the prefill one.
    assert {r.worker for r in recs} == {f"{pool}-w1"}
    assert handoffs() - before == 6
    # The decode worker computed no prompt: its modelled "prefill" is the KV's move over
    # the link and one token's step, far under a prefill of the step's prompt.
    for r in recs:
        assert r.prefill_s is not None and r.prefill_s < moved_prompt_bound(), r.prefill_s
    report = summarise(cfg, recs, played.wall_s, played.times)
    assert report.errors == {} and report.superseded == 0


def decode_requests(pool: str, link: str) -> float:
    labels = {"pool": pool, "link": link}
    return REGISTRY.get_sample_value("sy_router_decode_requests_total", labels) or 0.0


async def test_a_decode_stage_goes_to_the_decode_worker_nearest_its_prefill_worker(
    nats_url: str,
) -> None:
    """One prefill and two idle decode workers, one of them the prefill GPU's PIX peer (the
    same PCIe switch), the other across the sockets: every decode stage goes to the peer,
    whichever of the two it is, and the router counts the links its KV crossed."""
    for peer in (1, 2):
        topologies = ["gpu-server/0/0", "gpu-server/1/2", "gpu-server/1/2"]
        topologies[peer] = "gpu-server/0/0"
        async with agent_pool(nats_url, ("prefill", "decode", "decode"), tuple(topologies)
                              ) as pool:  # fmt: skip
            cfg = replace(CFG, nats_url=nats_url, tenant=f"pd{new_id().lower()[-8:]}",
                          phones=2, steps=3, workers=3)  # fmt: skip
            played = await play(cfg, nats_url)
        recs = played.records
        assert [r.status for r in recs] == ["ok"] * 6, [(r.status, r.code) for r in recs]
        assert {r.worker for r in recs} == {f"{pool}-w{peer}"}
        assert (decode_requests(pool, "PIX"), decode_requests(pool, "SYS")) == (6, 0)


async def test_a_colocated_worker_computes_the_prompt_itself(nats_url: str) -> None:
    """The control for the bound above: the same steps on a `both` worker."""
    before = handoffs()
    async with agent_pool(nats_url, ("both",)) as pool:
        cfg = replace(CFG, nats_url=nats_url, tenant=f"pd{new_id().lower()[-8:]}",
                      phones=1, steps=2, workers=1)  # fmt: skip
        played = await play(cfg, nats_url)
    (first, _) = sorted(played.records, key=lambda r: r.step)
    assert first.status == "ok" and first.worker == f"{pool}-w0"
    assert first.prefill_s is not None and first.prefill_s > 3 * moved_prompt_bound()
    assert handoffs() == before


def drill_env(pool: str, parts: int) -> dict[str, str]:
    """A drill's worker processes: sim engines in real time, partitions from the router."""
    return {"SY_ASSIGNMENT": "kv", "SY_POOL": pool, "SY_ENGINE": "sim",
            "SY_PARTITIONS": str(parts), "SY_SIM_DELAY_SCALE": "1"}  # fmt: skip


async def results_heard(
    bus: Bus, subject: str
) -> tuple[Counter[str], JetStreamContext.PushSubscription]:
    """How many times each request's final appears on RES under `subject` (an ordered
    consumer from now on), and the subscription to end."""
    on_res: Counter[str] = Counter()

    async def heard(msg: Msg) -> None:
        on_res[decode(msg.data, GenerateResult).request_id] += 1

    return on_res, await bus.js.subscribe(subject, cb=heard, ordered_consumer=True)


async def test_kill_9_of_a_prefill_and_a_decode_worker_loses_nothing_and_answers_once(
    nats_url: str, tmp_path: Path
) -> None:
    """The drill of #39: two prefill and two decode workers (processes) under a stream of
    requests; one of each is killed -9 while requests run on it. Every request is answered
    exactly once (on RES and on its reply stream), by the survivors where the dead held it:
    a stage on a dead worker's partition runs again on the worker that partition moves to.
    A handoff from a prefill run again elsewhere is still taken (the first version of the
    router dropped it as a repeat: `Ledger.decoding`)."""
    pool, tenant, parts = f"pk{new_id().lower()[-8:]}", f"t{new_id().lower()[-8:]}", 8
    bus = await connect(Settings(nats_url=nats_url), "pytest-pd-drill")
    await provision_pool(bus.js, pool, partitions=parts, ack_wait=TopologySettings().work_ack_wait)
    policy = tmp_path / "tenants.yaml"
    policy.write_text(yaml.safe_dump(
        {"default": {"itpm": 10**9, "otpm": 10**8, "max_queued_tokens": 10**9}}
    ))  # fmt: skip
    env = drill_env(pool, parts)
    on_res, res_sub = await results_heard(bus, f"res.llm.{tenant}")
    finals: Counter[str] = Counter()
    answered: dict[str, tuple[float, GenerateResult]] = {}
    running: dict[str, set[str]] = {"decode": set()}

    async def ask(req: GenerateRequest, sent: float) -> None:
        async with TokenStreamReader(bus.nc, idle_timeout=120) as reader:
            await publish(
                bus.js, f"req.llm.{tenant}", req.model_copy(update={"reply": reader.inbox})
            )
            async for frame in reader:
                if frame.type == "delta":
                    running["decode"].add(req.id)
                elif frame.result is not None:
                    finals[req.id] += 1
                    answered[req.id] = (time.monotonic() - sent, frame.result)

    workers = {
        f"{pool}-w{i}": role for i, role in enumerate(("prefill", "prefill", "decode", "decode"))
    }
    try:
        async with router_in_process(nats_url, partitions=parts, pools=[pool],
                                     tenant_policy=policy, rebalance_interval=0.2):  # fmt: skip
            with contextlib.ExitStack() as procs:
                children = {
                    w: procs.enter_context(service_process(
                        "worker", nats_url, SY_WORKER_ID=w, SY_WORKER_ROLE=role, **env))
                    for w, role in workers.items()
                }  # fmt: skip
                await wait_for_pool(bus.js, pool, len(workers), parts)
                # ~1,000-token prompts (a prefill of ~0.1 s) and 200-token answers (~3 s).
                reqs = [
                    GenerateRequest(
                        tenant=tenant,
                        workload="llm",
                        pool=pool,
                        prompt_tokens=1000,
                        messages=[ChatMessage(role="user", content=f"q{i} " + "word " * 900)],
                        sampling=Sampling(max_tokens=200, temperature=0.0, seed=1),
                    )
                    for i in range(30)
                ]
                asking = []
                for i, req in enumerate(reqs):
                    asking.append(asyncio.create_task(ask(req, time.monotonic())))
                    if i == 12:  # requests mid-decode on both decode workers, more arriving
                        await until(lambda: len(running["decode"]) >= 8, timeout=60,
                                    what="decode stages streaming")  # fmt: skip
                        for w in (f"{pool}-w0", f"{pool}-w2"):  # a prefill and a decode worker
                            children[w].proc.send_signal(signal.SIGKILL)
                            children[w].proc.wait(10)
                    await asyncio.sleep(0.05)
                await asyncio.wait_for(asyncio.gather(*asking), 120)
                await asyncio.sleep(2.0)  # room for a duplicate answer to show up on RES
    finally:
        await res_sub.unsubscribe()
        await bus.close()
    ids = {r.id for r in reqs}
    assert set(answered) == ids and set(on_res) == ids, f"lost: {ids - set(answered)}"
    assert all(n == 1 for n in on_res.values()) and all(n == 1 for n in finals.values())
    decoded_by = Counter(result.worker for _, result in answered.values())
    # The dead held requests: the survivors answered them (a dead worker's WORK goes to
    # whoever its partitions moved to, of either role: a stage runs wherever it lands).
    held = [r for _, r in answered.values() if r.route and r.route.routed_to == f"{pool}-w2"]
    assert held and {r.worker for r in held} <= {f"{pool}-w1", f"{pool}-w3"}, held
    assert f"{pool}-w3" in decoded_by
    dead = [r for _, r in answered.values() if r.status != "ok"]
    # A decode stage that had streamed tokens when its worker died is answered engine_error
    # (the worker-failover rule); none is lost or answered twice.
    assert all(r.error is not None and r.error.code == "engine_error" for r in dead), dead
    waits = [t for t, _ in answered.values()]
    print(
        f"drill: p50 {percentile(waits, 0.5):.2f} s, p99 {percentile(waits, 0.99):.2f} s, "
        f"by worker {dict(decoded_by)}, not ok {len(dead)}"
    )


async def test_kill_9_of_a_prefill_and_a_decode_worker_under_phones_reports_the_step_p99(
    nats_url: str,
) -> None:
    """#39's drill with agent steps: 8 phones on a 2p2d pool of worker processes; once
    the first steps are answered, one prefill and one decode worker are killed -9. Every
    step is answered exactly once (on RES too), the survivors answer the rest, and the
    step p50/p99 over the drill is printed (the README's figures)."""
    pool, parts = f"pa{new_id().lower()[-8:]}", 8
    tenant = f"pd{new_id().lower()[-8:]}"
    bus = await connect(Settings(nats_url=nats_url), "pytest-pd-agent-drill")
    await provision_pool(bus.js, pool, partitions=parts, ack_wait=TopologySettings().work_ack_wait)
    env = drill_env(pool, parts)
    on_res, res_sub = await results_heard(bus, f"res.agent.{tenant}")
    roles = ("prefill", "prefill", "decode", "decode")
    try:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(router_in_process(
                nats_url, partitions=parts, pools=[pool], rebalance_interval=0.2))  # fmt: skip
            await stack.enter_async_context(
                preprocessor_in_process(nats_url, agent_pool=pool, frame_procs=0)
            )
            with contextlib.ExitStack() as procs:
                children = [
                    procs.enter_context(service_process(
                        "worker", nats_url, SY_WORKER_ID=f"{pool}-w{i}", SY_WORKER_ROLE=role,
                        **env))
                    for i, role in enumerate(roles)
                ]  # fmt: skip
                await wait_for_pool(bus.js, pool, len(roles), parts)
                cfg = replace(CFG, nats_url=nats_url, tenant=tenant, phones=8, steps=8,
                              workers=4, act_ms=300)  # fmt: skip
                playing = asyncio.create_task(play(cfg, nats_url))
                await until(lambda: len(on_res) >= 8, timeout=60, what="the first steps")
                for i in (0, 2):  # a prefill and a decode worker, mid-load
                    children[i].proc.send_signal(signal.SIGKILL)
                    children[i].proc.wait(10)
                played = await asyncio.wait_for(playing, 180)
                # RES is read through an ordered consumer, which may lag a loaded machine.
                with contextlib.suppress(TimeoutError):
                    await until(lambda: len(on_res) >= len(played.records), timeout=30,
                                what="every answer on RES")  # fmt: skip
                await asyncio.sleep(2.0)  # room for a duplicate answer to show up on RES
    finally:
        await res_sub.unsubscribe()
        await bus.close()
    recs = played.records
    assert len(recs) == 8 * 8 and len(on_res) == len(recs), (
        len(recs), len(on_res), Counter((r.status, r.code, r.worker) for r in recs)
    )  # fmt: skip
    assert all(n == 1 for n in on_res.values()), [k for k, n in on_res.items() if n > 1]
    ok = [r for r in recs if r.status == "ok"]
    # A step that had streamed when its decode worker died is answered engine_error (typed,
    # final, once); every other step is answered by a survivor.
    assert all(r.code == "engine_error" for r in recs if r.status != "ok"), [
        (r.status, r.code) for r in recs if r.status != "ok"
    ]
    after = [r for r in ok if r.worker is not None]
    assert {r.worker for r in after} >= {f"{pool}-w3"}
    lat = [r.latency_s for r in recs]
    print(
        f"agent drill: {len(ok)}/{len(recs)} ok, step p50 {percentile(lat, 0.5) * 1000:.0f} ms, "
        f"p99 {percentile(lat, 0.99) * 1000:.0f} ms, by worker "
        f"{dict(Counter(r.worker for r in ok))}"
    )
