"""Per-request routing on real NATS: tenants' caches kept apart on each engine, session
routes shared through KV by several routers, and sessions moving when a worker dies or
joins while requests keep coming."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml
from nats.aio.msg import Msg

from switchyard.bus.connection import Bus
from switchyard.bus.topology import SESSIONS_BUCKET
from switchyard.codec import decode
from switchyard.engines.base import EngineRequest
from switchyard.engines.sim import SimEngine, SimSettings
from switchyard.fleet.readiness import PoolReady, wait_for_pools
from switchyard.messages.fleet import SessionRoute, session_key
from switchyard.messages.inference import ChatMessage, GenerateRequest, GenerateResult, Sampling
from tests.support.fleet import (
    provision_pool,
    router_in_process,
    service_process,
    submit,
    wait_for_pool,
    worker_in_process,
)
from tests.support.poll import until

# Long enough to fill several KV blocks on every engine (llama.cpp reuses any common
# prefix; the sim caches whole 16-token blocks).
SYSTEM = (
    "You are the operations assistant of a mobile game studio. Answer briefly and "
    "exactly, in the language of the question, about players, revenue and events. "
) * 3


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(yaml.safe_dump({
        "default": {"itpm": 10**9, "otpm": 10**8, "max_queued_tokens": 10**9},
        "tenants": {"acme-eu": {"cache_group": "acme"}},
    }))  # fmt: skip
    return path


def chat(pool: str, tenant: str, question: str, **kw: object) -> GenerateRequest:
    return GenerateRequest(
        tenant=tenant, workload="llm", pool=pool,
        messages=[ChatMessage(role="system", content=SYSTEM),
                  ChatMessage(role="user", content=question)],
        sampling=Sampling(max_tokens=2, temperature=0.0), prompt_tokens=120,
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


async def cached(bus: Bus, req: GenerateRequest) -> int:
    frames = await submit(bus, req, timeout=120)
    result = frames[-1].result
    assert result is not None and result.status == "ok", frames[-1]
    return result.usage.cached_tokens


@pytest.mark.parametrize("engine", ["sim", "llamacpp"])
async def test_tenants_never_share_cached_prefixes_unless_their_policy_groups_them(
    bus: Bus, unique: str, nats_url: str, policy_file: Path, engine: str
) -> None:
    pool = f"salt{engine[:3]}{unique}"
    await provision_pool(bus.js, pool)
    async with (
        router_in_process(nats_url, partitions=4, pools=[pool], tenant_policy=policy_file,
                          rebalance_interval=0.2),
        worker_in_process(nats_url, pool=pool, engine=engine, assignment="kv",
                          worker_id=f"{pool}-w0", heartbeat_interval=0.3),
    ):  # fmt: skip
        await wait_for_pool(bus.js, pool)
        assert await cached(bus, chat(pool, "acme", "How many players today?")) == 0
        assert await cached(bus, chat(pool, "acme", "How many players today?")) > 0
        # acme-eu's policy puts it in acme's cache group: it shares acme's prefixes.
        assert await cached(bus, chat(pool, "acme-eu", "How many players today?")) > 0
        # Same prompt, another tenant: nothing of acme's prefix, even when it forges the salt.
        assert await cached(bus, chat(pool, "globex", "How many players today?")) == 0
        forged = chat(pool, "initech", "How many players today?", cache_salt="acme")
        assert await cached(bus, forged) == 0


async def test_the_vllm_adapter_passes_the_routers_salt_to_the_engine() -> None:
    """The vLLM side of the same guarantee: the salt the router set reaches vLLM's prompt
    (tests/unit/test_engine_vllm_mapping.py maps it; real vLLM runs in its own tier); here
    the sim engine, which hashes blocks the way vLLM does, shows what the salt buys."""
    engine = SimEngine(SimSettings(delay_scale=0.0))
    await engine.start()
    try:
        prompt = SYSTEM + " How many players today?"
        for salt, hit in (("acme", False), ("acme", True), ("globex", False)):
            req = EngineRequest(request_id=f"{salt}-{hit}", prompt=prompt, cache_salt=salt)
            deltas = [d async for d in engine.generate(req)]
            assert (deltas[-1].cached_tokens > 0) is hit, (salt, deltas[-1].cached_tokens)
    finally:
        await engine.close()


# --- session routes in KV ------------------------------------------------------------------


def step(pool: str, session: str, k: int) -> GenerateRequest:
    return GenerateRequest(
        tenant="acme", workload="agent", pool=pool, session=session,
        messages=[ChatMessage(role="system", content=SYSTEM),
                  ChatMessage(role="user", content=f"step {k} of {session}")],
        sampling=Sampling(max_tokens=4), prompt_tokens=120,
    )  # fmt: skip


async def run_sessions(
    bus: Bus, pool: str, sessions: list[str], steps: int, seen: dict[str, list[str]]
) -> None:
    """Each session sends its steps one after the other, as a phone does."""

    async def one(session: str) -> None:
        for k in range(steps):
            frames = await submit(bus, step(pool, session, k), timeout=120)
            result = frames[-1].result
            assert result is not None and result.status == "ok" and result.worker, frames[-1]
            seen[session].append(result.worker)

    await asyncio.gather(*(one(s) for s in sessions))


async def test_two_routers_send_a_session_to_one_worker_through_kv(
    bus: Bus, unique: str, nats_url: str, policy_file: Path
) -> None:
    pool = f"kv{unique}"
    await provision_pool(bus.js, pool, partitions=8)
    seen: dict[str, list[str]] = defaultdict(list)
    async with contextlib.AsyncExitStack() as stack:
        for r in ("a", "b"):  # both pull from the one REQ consumer: requests split between them
            await stack.enter_async_context(router_in_process(
                nats_url, partitions=8, pools=[pool], tenant_policy=policy_file,
                rebalance_interval=0.2, router_id=f"router-{r}{unique}"))  # fmt: skip
        for i in range(3):
            await stack.enter_async_context(worker_in_process(
                nats_url, pool=pool, engine="sim", assignment="kv", partitions=8,
                worker_id=f"{pool}-w{i}", heartbeat_interval=0.3))  # fmt: skip
        await wait_for_pool(bus.js, pool, 3, 8)
        sessions = [f"s{i}" for i in range(24)]
        await run_sessions(bus, pool, sessions, 5, seen)
    assert all(len(set(workers)) == 1 for workers in seen.values()), dict(seen)
    assert len({w[0] for w in seen.values()}) == 3  # and the sessions spread over the pool
    kv = await bus.js.key_value(SESSIONS_BUCKET)
    for session, workers in seen.items():
        entry = await kv.get(session_key(pool, "acme", session))
        assert decode(entry.value or b"", SessionRoute).worker == workers[0]


async def test_a_restarted_router_keeps_every_session_on_its_worker(
    bus: Bus, unique: str, nats_url: str, policy_file: Path
) -> None:
    pool = f"rs{unique}"
    await provision_pool(bus.js, pool, partitions=8)
    seen: dict[str, list[str]] = defaultdict(list)
    sessions = [f"s{i}" for i in range(16)]
    async with contextlib.AsyncExitStack() as stack:
        for i in range(3):
            await stack.enter_async_context(worker_in_process(
                nats_url, pool=pool, engine="sim", assignment="kv", partitions=8,
                worker_id=f"{pool}-w{i}", heartbeat_interval=0.3))  # fmt: skip
        for _life in range(2):  # the same router id, started twice
            async with router_in_process(
                nats_url, partitions=8, pools=[pool], tenant_policy=policy_file,
                rebalance_interval=0.2,
            ) as router:  # fmt: skip
                await wait_for_pool(router.bus.js, pool, 3, 8)
                await run_sessions(bus, pool, sessions, 3, seen)
    assert all(len(set(workers)) == 1 for workers in seen.values()), dict(seen)


# --- worker loss and join under load -------------------------------------------------------


async def test_sessions_move_off_a_dead_worker_and_a_joiner_takes_new_sessions(
    bus: Bus, unique: str, nats_url: str, policy_file: Path
) -> None:
    pool, parts = f"lj{unique}", 12
    await provision_pool(bus.js, pool, partitions=parts, ack_wait=2.0)
    env = {
        "SY_ASSIGNMENT": "kv", "SY_POOL": pool, "SY_ENGINE": "sim", "SY_PARTITIONS": str(parts),
        "SY_HEARTBEAT_INTERVAL": "0.3", "SY_SIM_DELAY_SCALE": "0.5",
    }  # fmt: skip
    answers: Counter[str] = Counter()

    async def on_res(msg: Msg) -> None:
        answers[decode(msg.data, GenerateResult).request_id] += 1

    res = await bus.js.subscribe("res.agent.acme", cb=on_res, ordered_consumer=True)
    sent: list[str] = []
    seen: dict[str, list[str]] = defaultdict(list)
    stop = asyncio.Event()

    async def phone(session: str) -> None:
        k = 0
        while not stop.is_set():
            req = step(pool, session, k)
            sent.append(req.id)
            frames = await submit(bus, req, timeout=120)
            result = frames[-1].result
            assert result is not None and result.status == "ok" and result.worker, frames[-1]
            seen[session].append(result.worker)
            k += 1
            # A phone's think time: without it 20 phones at 4-token answers kept this 2-core
            # box saturated (~280 steps/s), and after the kill one session once starved.
            await asyncio.sleep(0.05)

    # Hold off load moves for this test: it shows the moves death and joins cause alone.
    async with router_in_process(
        nats_url, partitions=parts, pools=[pool], tenant_policy=policy_file,
        # dead_after 8 s, as in test_router: under a full suite a live worker's heartbeat
        # has lagged past 4 s, and a second "death" is not what this test is about.
        rebalance_interval=0.2, dead_after=8.0, move_hold=600.0,
    ):  # fmt: skip
        w0, w1, w2 = (f"{pool}-w{i}" for i in range(3))
        with contextlib.ExitStack() as stack:
            doomed = stack.enter_context(service_process("worker", nats_url, SY_WORKER_ID=w0,
                                                         **env))  # fmt: skip
            stack.enter_context(service_process("worker", nats_url, SY_WORKER_ID=w1, **env))
            await wait_for_pool(bus.js, pool, 2, parts)
            settled = [f"old{i}" for i in range(12)]
            phones = [asyncio.create_task(phone(s)) for s in settled]
            await until(lambda: all(len(seen[s]) >= 3 for s in settled), timeout=60,
                        what="every settled session 3 steps in")  # fmt: skip
            on_w0 = {s for s in settled if seen[s][0] == w0}
            assert on_w0 and len(on_w0) < len(settled)  # both workers took sessions
            doomed.proc.kill()  # SIGKILL mid-flight
            doomed.proc.wait(10)
            steps_at_death = {s: len(seen[s]) for s in settled}
            await until(lambda: all(len(seen[s]) >= steps_at_death[s] + 3 for s in settled),
                        timeout=90, what="every session 3 steps past the death")  # fmt: skip
            joiner = stack.enter_context(service_process("worker", nats_url, SY_WORKER_ID=w2,
                                                         **env))  # fmt: skip
            joined_at = {s: len(seen[s]) for s in settled}
            survivors = PoolReady(pool, 2, parts, worker_ids=(w1, w2))
            await wait_for_pools(bus.js, [survivors], timeout=120, check=joiner.check)
            fresh = [f"new{i}" for i in range(8)]
            phones += [asyncio.create_task(phone(s)) for s in fresh]
            await until(lambda: all(len(seen[s]) >= 3 for s in fresh), timeout=60,
                        what="every new session 3 steps in")  # fmt: skip
            stop.set()
            await asyncio.gather(*phones)
        await until(lambda: set(sent) <= set(answers), timeout=30, what="every result on RES")
    await res.unsubscribe()
    assert all(n == 1 for n in answers.values()), "a request was answered twice"
    for s in on_w0:  # moved once, to the survivor, and stayed there
        after = seen[s][steps_at_death[s] + 1 :]
        assert set(after) == {w1}, (s, seen[s])
    for s in set(settled) - on_w0:  # never moved, not even when w2 joined
        assert set(seen[s]) == {w1}, (s, seen[s])
    assert all(len(set(seen[s][joined_at[s] :])) == 1 for s in settled)
    new_on = Counter(seen[s][0] for s in fresh)
    assert new_on[w2] > new_on[w1], new_on  # the empty joiner takes most new sessions
    assert all(len(set(seen[s])) == 1 for s in fresh)
