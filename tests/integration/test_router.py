"""The router on real NATS with `sim` workers: admission, answers, staleness, cancels,
affinity and failover."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from nats.aio.msg import Msg
from prometheus_client import REGISTRY

from services.router.router import Router
from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.bus.topology import ASSIGNMENTS_BUCKET, ROUTER_DURABLE
from switchyard.codec import decode
from switchyard.messages.fleet import Assignment, assignment_key
from switchyard.messages.inference import (
    ChatMessage,
    GenerateRequest,
    GenerateResult,
    Sampling,
    TokenFrame,
)
from tests.support.fleet import (
    provision_pool,
    router_in_process,
    service_process,
    submit,
    wait_for_pool,
    worker_in_process,
)
from tests.support.poll import until
from tests.support.proxy import cuttable_proxy

POLICY = {
    "default": {"itpm": 10_000_000, "otpm": 1_000_000, "max_queued_tokens": 50_000_000},
    "tenants": {
        "small-in": {"itpm": 6000, "otpm": 1_000_000},
        "small-out": {"itpm": 10_000_000, "otpm": 6000},
        "heavy": {"itpm": 100_000_000, "otpm": 1_000_000, "max_queued_tokens": 100_000_000},
    },
}


@pytest.fixture
async def pool(bus: Bus, unique: str) -> str:
    name = f"r{unique}"
    await provision_pool(bus.js, name)
    return name


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(yaml.safe_dump(POLICY))
    return path


def req(pool: str, tenant: str = "acme", **kw: object) -> GenerateRequest:
    fields: dict[str, object] = {
        "tenant": tenant,
        "workload": "llm",
        "pool": pool,
        "messages": [ChatMessage(role="user", content="hello")],
        "sampling": Sampling(max_tokens=8),
        "prompt_tokens": 20,
        **kw,
    }
    return GenerateRequest(**fields)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def fleet(
    nats_url: str,
    pool: str,
    policy: Path,
    workers: int = 1,
    partitions: int = 4,
    dead_after: float = 4.0,
    heartbeat: float = 0.3,
    **router: object,
) -> AsyncIterator[Any]:
    """Router and `workers` sim workers on `pool` (beating every `heartbeat` s); yields the
    `Router` once every partition is assigned and bound."""
    async with contextlib.AsyncExitStack() as stack:
        running = await stack.enter_async_context(
            router_in_process(
                nats_url, partitions=partitions, pools=[pool], tenant_policy=policy,
                rebalance_interval=0.2, dead_after=dead_after, **router,
            )
        )  # fmt: skip
        for i in range(workers):
            await stack.enter_async_context(
                worker_in_process(
                    nats_url, pool=pool, engine="sim", assignment="kv",
                    worker_id=f"{pool}-w{i}", heartbeat_interval=heartbeat, partitions=partitions,
                )
            )  # fmt: skip
        await wait_for_pool(running.bus.js, pool, workers, partitions)
        yield running


def final(frames: list[TokenFrame]) -> TokenFrame:
    assert frames and frames[-1].type in ("end", "error")
    return frames[-1]


def reached(router: Router, tenant: str, sent: list[asyncio.Task[list[TokenFrame]]]) -> bool:
    """Whether every request of `sent` (all of `tenant`) reached `router`: it queues it,
    has dispatched it or it was answered."""
    held = router.queue.depth(tenant)
    held += sum(o.tenant == tenant for o in router.ledger.outstanding.values())
    return held + sum(t.done() for t in sent) >= len(sent)


async def test_requests_flow_through_the_router(
    bus: Bus, pool: str, policy_file: Path, nats_url: str
) -> None:
    async with fleet(nats_url, pool, policy_file):
        frames = [await submit(bus, req(pool, session=f"s{i}"), timeout=10) for i in range(10)]
    results = [final(f).result for f in frames]
    assert all(r is not None and r.status == "ok" and r.worker == f"{pool}-w0" for r in results)
    assert all(r is not None and r.usage.completion_tokens == 8 for r in results)


@pytest.fixture(autouse=True)
def instant_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SY_SIM_DELAY_SCALE", "0")


async def test_input_quota_answers_retry_after_that_works_when_honoured(
    bus: Bus, pool: str, policy_file: Path, nats_url: str
) -> None:
    async with fleet(nats_url, pool, policy_file):
        first, refused = [
            final(frames)
            for frames in await asyncio.gather(
                submit(bus, req(pool, "small-in", prompt_tokens=3050)),
                submit(bus, req(pool, "small-in", prompt_tokens=3050)),
            )
        ]
        if first.type == "error":
            first, refused = refused, first
        assert first.result and first.result.status == "ok"
        assert refused.type == "error" and refused.error and refused.error.code == "over_quota"
        assert "input" in refused.error.reason
        retry_after = refused.error.retry_after
        assert retry_after is not None and 0.5 <= retry_after <= 1.5
        await asyncio.sleep(retry_after)
        honoured = final(await submit(bus, req(pool, "small-in", prompt_tokens=3050)))
    assert honoured.result and honoured.result.status == "ok"


async def test_output_quota_is_enforced_separately(
    bus: Bus, pool: str, policy_file: Path, nats_url: str
) -> None:
    async with fleet(nats_url, pool, policy_file):
        big_out = {"sampling": Sampling(max_tokens=3050)}
        first, refused = [
            final(frames)
            for frames in await asyncio.gather(
                submit(bus, req(pool, "small-out", prompt_tokens=10, **big_out)),
                submit(bus, req(pool, "small-out", prompt_tokens=10, **big_out)),
            )
        ]
        if first.type == "error":
            first, refused = refused, first
        # Its input budget is untouched: a request with a big prompt and a small output fits.
        small = final(await submit(bus, req(pool, "small-out", prompt_tokens=5000)))
    assert first.result and first.result.status == "ok"
    assert refused.error and refused.error.code == "over_quota" and "output" in refused.error.reason
    assert small.result and small.result.status == "ok"


async def test_unknown_tenant_is_refused_without_a_default_policy(
    bus: Bus, pool: str, tmp_path: Path, nats_url: str
) -> None:
    strict = tmp_path / "strict.yaml"
    strict.write_text(yaml.safe_dump({"tenants": {"acme": {}}}))
    async with fleet(nats_url, pool, strict):
        unknown = final(await submit(bus, req(pool, "nobody-knows")))
        known = final(await submit(bus, req(pool, "acme")))
    assert unknown.error and unknown.error.code == "unknown_tenant"
    assert known.result and known.result.status == "ok"


async def test_stale_steps_are_never_dispatched(
    bus: Bus, pool: str, policy_file: Path, nats_url: str
) -> None:
    async with fleet(nats_url, pool, policy_file):
        old = req(pool, session="ep", frame_ts=time.time() - 5, stale_after=1.0)
        answer = final(await submit(bus, old))
    assert answer.result and answer.result.status == "stale" and answer.result.worker is None
    assert answer.result.error and "5." in answer.result.error.reason  # the measured age


async def test_cancel_removes_a_queued_request(
    bus: Bus, pool: str, policy_file: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SY_SIM_MAX_NUM_SEQS", "1")  # one slot, credit 1: the rest queue
    monkeypatch.setenv("SY_SIM_DELAY_SCALE", "0.1")
    async with fleet(nats_url, pool, policy_file, credit_per_slot=1) as router:
        long = req(pool, session="a", sampling=Sampling(max_tokens=400))
        queued = req(pool, session="a", sampling=Sampling(max_tokens=8))
        async with (
            TokenStreamReader(bus.nc, idle_timeout=30) as r1,
            TokenStreamReader(bus.nc, idle_timeout=30) as r2,
        ):
            for r, reader in ((long, r1), (queued, r2)):
                sent = r.model_copy(update={"reply": reader.inbox})
                await publish(bus.js, subjects.req("llm", r.tenant), sent)
            await until(
                lambda: long.id in router.ledger and router.queue.get(queued.id) is not None,
                timeout=30, what="the long request running, the other queued in the router",
            )  # fmt: skip
            await bus.nc.publish(subjects.cancel(queued.id), b"")
            cancelled = final([f async for f in r2])
            done = final([f async for f in r1])
    assert cancelled.result and cancelled.result.status == "cancelled"
    assert cancelled.result.worker is None  # answered by the router: it never reached a worker
    assert done.result and done.result.status == "ok"


async def test_sessions_stick_to_their_workers(
    bus: Bus, pool: str, policy_file: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Counter[str]] = defaultdict(Counter)
    await provision_pool(bus.js, pool, partitions=64)
    # A loaded CI box can stall 8 in-process workers' heartbeats: only a real death may move.
    async with fleet(nats_url, pool, policy_file, workers=8, partitions=64, dead_after=15.0):
        sessions = [f"s{i}" for i in range(200)]
        for _step in range(5):
            rounds = await asyncio.gather(*(submit(bus, req(pool, session=s)) for s in sessions))
            for s, frames in zip(sessions, rounds, strict=True):
                r = final(frames).result
                assert r is not None and r.status == "ok" and r.worker
                seen[s][r.worker] += 1
    stickiness = [max(c.values()) / sum(c.values()) for c in seen.values()]
    assert min(stickiness) == 1.0  # no worker died: every step of a session on one worker
    assert len({w for c in seen.values() for w in c}) == 8  # and the load is spread


async def test_router_kill_9_under_load_loses_nothing_and_answers_once(
    bus: Bus, unique: str, policy_file: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool, tenant = f"k{unique}", f"t{unique}"
    await provision_pool(bus.js, pool, req_ack_wait=2.0)
    monkeypatch.setenv("SY_SIM_MAX_NUM_SEQS", "2")  # 2 slots x credit 1: most requests queue
    monkeypatch.setenv("SY_SIM_DELAY_SCALE", "0.5")
    env = {
        "SY_POOLS": f'["{pool}"]', "SY_PARTITIONS": "4", "SY_TENANT_POLICY": str(policy_file),
        "SY_REBALANCE_INTERVAL": "0.2", "SY_CREDIT_PER_SLOT": "1",
    }  # fmt: skip
    results: Counter[str] = Counter()
    terminal: Counter[str] = Counter()

    async def on_res(msg: Msg) -> None:
        results[decode(msg.data, GenerateResult).request_id] += 1

    def counter(rid: str) -> Callable[[Msg], Awaitable[None]]:
        async def on_frame(msg: Msg) -> None:
            if decode(msg.data, TokenFrame).type != "delta":
                terminal[rid] += 1

        return on_frame

    res_sub = await bus.js.subscribe(f"res.llm.{tenant}", cb=on_res, ordered_consumer=True)
    reqs = [req(pool, tenant, session=f"s{i}", sampling=Sampling(max_tokens=20)) for i in range(40)]
    async with worker_in_process(
        nats_url, pool=pool, engine="sim", assignment="kv", worker_id=f"{pool}-w0",
        heartbeat_interval=0.3,
    ):  # fmt: skip
        with service_process("router", nats_url, **env) as first:
            await wait_for_pool(bus.js, pool, check=first.check)
            for r in reqs:
                inbox = bus.nc.new_inbox()
                await bus.nc.subscribe(inbox, cb=counter(r.id))
                await publish(
                    bus.js, subjects.req("llm", tenant), r.model_copy(update={"reply": inbox})
                )
            await until(lambda: under_load(bus, results), timeout=60,
                        what="the router holding every request, some answered")  # fmt: skip
            first.proc.kill()  # SIGKILL, with most requests still queued in it
            first.proc.wait(10)
        answered_before = len(results)
        with service_process("router", nats_url, **env):
            ids = {r.id for r in reqs}
            await until(lambda: ids <= set(results), timeout=90, what="every request answered")
            await asyncio.sleep(2.0)  # room for a duplicate to show up
    await res_sub.unsubscribe()
    assert answered_before < len(ids)  # the crash really left work behind
    assert set(results) == ids, f"lost {len(ids - set(results))}"
    assert all(n == 1 for n in results.values())
    assert set(terminal) == ids and all(n == 1 for n in terminal.values())


async def under_load(bus: Bus, results: Counter[str]) -> bool:
    """Whether the router has taken every request from REQ and answered some of them."""
    info = await bus.js.consumer_info("REQ", ROUTER_DURABLE)
    return info.num_pending == 0 and len(results) > 0


async def _assignment(bus: Bus, pool: str, partitions: int) -> dict[int, str]:
    kv = await bus.js.key_value(ASSIGNMENTS_BUCKET)
    owners = {}
    for p in range(partitions):
        entry = await kv.get(assignment_key(pool, p))
        owners[p] = decode(entry.value or b"", Assignment).worker
    return owners


async def test_dead_worker_loses_its_partitions_only_and_no_request_is_lost(
    bus: Bus, unique: str, policy_file: Path, nats_url: str
) -> None:
    pool, parts = f"d{unique}", 12
    await provision_pool(bus.js, pool, partitions=parts, ack_wait=2.0)
    env = {
        "SY_ASSIGNMENT": "kv", "SY_POOL": pool, "SY_ENGINE": "sim", "SY_PARTITIONS": str(parts),
        "SY_HEARTBEAT_INTERVAL": "0.3", "SY_SIM_DELAY_SCALE": "0.2",
        # One slot each (router credit 2): most of the 30 requests still wait in the router
        # when the worker dies, so its partitions must move before they can be answered.
        "SY_SIM_MAX_NUM_SEQS": "1",
    }  # fmt: skip
    workers = [f"{pool}-w{i}" for i in range(3)]
    async with router_in_process(
        nats_url, partitions=parts, pools=[pool], tenant_policy=policy_file,
        # 8 s, not 4: in a full `make test` on 2 cores a live worker's heartbeat once
        # lagged over 4 s under this burst and it was (rightly, by its TTL) declared dead,
        # which moved partitions this test does not kill.
        rebalance_interval=0.2, dead_after=8.0,
    ) as router:  # fmt: skip
        with contextlib.ExitStack() as stack:
            procs = [
                stack.enter_context(service_process("worker", nats_url, SY_WORKER_ID=w, **env))
                for w in workers
            ]

            # Workers start one by one: wait until the router has placed all three (it
            # moves nothing more afterwards while they live and carry no load).
            def alive() -> None:
                for proc in procs:
                    proc.check()

            await wait_for_pool(bus.js, pool, len(workers), parts, check=alive)
            before = await _assignment(bus, pool, parts)
            assert set(before.values()) == set(workers)
            sessions = [f"s{i}" for i in range(30)]
            doomed = workers[0]
            pending = [
                asyncio.create_task(
                    submit(bus, req(pool, session=s, sampling=Sampling(max_tokens=40)), timeout=60)
                )
                for s in sessions
            ]
            await until(lambda: reached(router, "acme", pending), timeout=30,
                        what="the burst in the router")  # fmt: skip
            procs[0].proc.kill()
            procs[0].proc.wait(10)
            answers = [final(frames) for frames in await asyncio.gather(*pending)]
            after = await _assignment(bus, pool, parts)
    assert all(a.result and a.result.status == "ok" for a in answers), [
        (a.type, a.error) for a in answers if not a.result or a.result.status != "ok"
    ]
    moved = {p for p in range(parts) if before[p] != after[p]}
    assert moved == {p for p, w in before.items() if w == doomed}
    assert doomed not in after.values()


async def _light_waits(bus: Bus, pool: str, n: int) -> list[float]:
    waits = []
    for i in range(n):
        frames = await submit(bus, req(pool, "light", session=f"light{i}"))
        result = final(frames).result
        assert result is not None and result.status == "ok"
        waits.append(result.timings.queue)
        await asyncio.sleep(0.05)  # one light request at a time, paced, not a burst
    return waits


async def test_a_flood_of_huge_prompts_does_not_starve_a_light_tenant(
    bus: Bus, pool: str, policy_file: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One scheduling round: the light tenant waits at most for one heavy request to finish."""
    monkeypatch.setenv("SY_SIM_MAX_NUM_SEQS", "1")
    monkeypatch.setenv("SY_SIM_DELAY_SCALE", "0.05")
    monkeypatch.setenv("SY_SIM_MAX_MODEL_LEN", "131072")
    monkeypatch.setenv("SY_SIM_KV_CAPACITY_TOKENS", "400000")
    huge = " ".join(["word"] * 40_000)  # ~40k simulated tokens: ~4.4 s of modelled prefill
    async with fleet(nats_url, pool, policy_file, credit_per_slot=1) as router:
        quiet = await _light_waits(bus, pool, 5)
        flood = [
            asyncio.create_task(
                submit(
                    bus,
                    req(
                        pool,
                        "heavy",
                        session=f"h{i}",
                        prompt=huge,
                        messages=None,
                        prompt_tokens=100_000,
                    ),
                    timeout=120,
                )
            )
            for i in range(12)
        ]
        await until(lambda: reached(router, "heavy", flood), timeout=30, what="the flood")
        busy = await _light_waits(bus, pool, 5)
        heavy = [final(frames).result for frames in await asyncio.gather(*flood)]
    service = max(r.timings.total - r.timings.queue for r in heavy if r is not None)
    print(f"light tenant queue wait p-max: quiet {max(quiet):.3f}s, during flood "
          f"{max(busy):.3f}s; one heavy request takes {service:.3f}s")  # fmt: skip
    assert all(r is not None and r.status == "ok" for r in heavy)
    # FIFO would make the light tenant wait behind all 12 heavy requests.
    assert max(busy) <= max(quiet) + service + 0.25


async def test_an_answered_request_frees_its_credit_before_the_next_heartbeat(
    bus: Bus, pool: str, policy_file: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's heartbeat counts what it holds; the next request may go as soon as the
    router sees the answer, not when the next heartbeat says the worker holds nothing."""
    monkeypatch.setenv("SY_SIM_MAX_NUM_SEQS", "1")
    monkeypatch.setenv("SY_SIM_DELAY_SCALE", "1")
    beat = 2.0
    long = Sampling(max_tokens=48)  # ~0.6 s of modelled decode each
    async with fleet(nats_url, pool, policy_file, credit_per_slot=1, heartbeat=beat,
                     dead_after=10.0):  # fmt: skip
        # Busy for longer than a beat: some heartbeat is taken while a request runs, and
        # says `queued=1` until the next one.
        frames = await asyncio.gather(
            *(submit(bus, req(pool, "light", session=f"c{i}", sampling=long)) for i in range(5))
        )
    results = [final(f).result for f in frames]
    assert all(r is not None and r.status == "ok" and r.route is not None for r in results)
    runs = sorted((r.route.started_at, r.route.finished_at) for r in results if r and r.route)
    busy = runs[-1][1] - runs[0][0]
    gaps = [nxt[0] - end for (_, end), nxt in itertools.pairwise(runs)]
    print(f"busy {busy:.2f}s, idle gaps between requests {[round(g, 3) for g in gaps]}")
    assert busy > beat, "the run must outlast a heartbeat to mean anything"
    # Waiting on the next heartbeat, one gap would be over beat - 0.6 s = 1.4 s.
    assert max(gaps) < 0.5


async def test_two_backlogged_tenants_get_token_fair_service_on_nats(
    bus: Bus, pool: str, policy_file: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tenant A sends 100-token prompts, B 2,000-token prompts, both always backlogged:
    the weighted tokens each is served stay within the VTC bound of each other."""
    monkeypatch.setenv("SY_SIM_MAX_NUM_SEQS", "1")
    monkeypatch.setenv("SY_SIM_DELAY_SCALE", "0.1")
    sizes = {"fair-a": 100, "fair-b": 2000}
    served: Counter[str] = Counter()
    w_in, w_out = 1.0, 2.0  # the router's defaults
    stop = asyncio.Event()

    async def tenant_loop(tenant: str) -> None:
        async def one() -> None:
            while not stop.is_set():
                r = req(pool, tenant, prompt_tokens=sizes[tenant], sampling=Sampling(max_tokens=8))
                result = final(await submit(bus, r)).result
                if result is not None and result.status == "ok" and not stop.is_set():
                    served[tenant] += int(
                        w_in * sizes[tenant] + w_out * result.usage.completion_tokens
                    )

        await asyncio.gather(*(one() for _ in range(6)))  # 6 outstanding: always backlogged

    async with fleet(nats_url, pool, policy_file, credit_per_slot=1):
        loops = [asyncio.create_task(tenant_loop(t)) for t in sizes]
        await asyncio.sleep(15.0)  # the window the service is measured over
        stop.set()
        await asyncio.gather(*loops)
    bound = w_in * 2000 + w_out * 8  # the largest single request's cost
    print(f"served weighted tokens over 15 s: {dict(served)}; bound {bound:.0f}")
    assert served["fair-a"] > 0 and served["fair-b"] > 0
    # One request in flight at a time (credit 1): within twice the bound, not 20x apart
    # as request-count fairness would give.
    assert abs(served["fair-a"] - served["fair-b"]) <= 2 * bound + bound


async def test_a_result_published_while_the_router_was_cut_off_frees_its_tenant_slot(
    bus: Bus, pool: str, tmp_path: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router hears results on a core subscription, so one published while its own
    connection is down never reaches it. After the reconnect it reads them back from RES:
    the tenant's one concurrency slot and the worker's credit come back, and the tenant's
    next request runs (it was refused `over_quota` until the router restarted)."""
    monkeypatch.setenv("SY_SIM_DELAY_SCALE", "1")
    solo = tmp_path / "solo.yaml"
    solo.write_text(yaml.safe_dump({"tenants": {"solo": {"max_concurrency": 1}}}))
    port = int(nats_url.rsplit(":", 1)[1])
    async with contextlib.AsyncExitStack() as stack:
        proxy = await stack.enter_async_context(cuttable_proxy(port))
        router = await stack.enter_async_context(
            router_in_process(proxy.url, partitions=2, pools=[pool], tenant_policy=solo,
                              rebalance_interval=0.2, dead_after=30.0)
        )  # fmt: skip
        await stack.enter_async_context(
            worker_in_process(nats_url, pool=pool, engine="sim", assignment="kv",
                              worker_id=f"{pool}-w0", heartbeat_interval=0.3, partitions=2)
        )  # fmt: skip
        await wait_for_pool(bus.js, pool, 1, 2)
        first = req(pool, "solo", sampling=Sampling(max_tokens=160))  # ~2 s of modelled decode
        running = asyncio.create_task(submit(bus, first, timeout=30))
        await until(
            lambda: first.id in router.ledger and not router.settling,
            timeout=15, what="the first request dispatched and its REQ message acked",
        )  # fmt: skip
        await proxy.cut()
        answered = final(await running)  # while the router cannot hear it
        assert answered.result and answered.result.status == "ok"
        assert router.admission.inflight("solo") == 1
        await proxy.open()
        await until(
            lambda: router.admission.inflight("solo") == 0 and not router.ledger.outstanding,
            timeout=20, what="the router reading the missed result back from RES",
        )  # fmt: skip
        second = final(await submit(bus, req(pool, "solo"), timeout=20))
    assert second.result and second.result.status == "ok", second


async def test_a_request_dispatched_again_after_its_answer_frees_its_tenant_slot(
    bus: Bus, pool: str, tmp_path: Path, nats_url: str
) -> None:
    """REQ hands a router a request whose answer is already on RES: its REQ ack was lost
    (its leader died during a failover) or the router that dispatched it died before
    acking. Dispatched again, WORK says duplicate (it ran once, and runs no more), so no
    result will come: the router takes the earlier one from RES, and the tenant's one
    concurrency slot comes back (before, it stayed held until the 600 s backstop, and
    the tenant's next request was refused `over_quota`)."""
    solo = tmp_path / "solo.yaml"
    solo.write_text(yaml.safe_dump({"tenants": {"solo": {"max_concurrency": 1}}}))
    async with fleet(nats_url, pool, solo) as router:
        first = req(pool, "solo")
        answered = final(await submit(bus, first, timeout=20))
        assert answered.result and answered.result.status == "ok"
        await until(lambda: router.admission.inflight("solo") == 0, timeout=10, what="settled")
        # The same REQ message again (a redelivery: another stream sequence, the same body).
        await publish(bus.js, subjects.req("llm", "solo"), first, msg_id=f"{first.id}-again")
        # Observed in the router's dispatch count (booked once a dispatch is settled), not
        # in its queue or reservations: all of the second pass can happen between two polls.
        await until(lambda: _dispatches(pool) == 2, timeout=10, what="dispatched again")
        await until(
            lambda: router.admission.inflight("solo") == 0 and first.id not in router.ledger,
            timeout=10, what="the earlier result taken from RES",
        )  # fmt: skip
        second = final(await submit(bus, req(pool, "solo"), timeout=20))
    assert second.result and second.result.status == "ok", second


def _dispatches(pool: str) -> float:
    """The router's settled dispatches on `pool` (`sy_router_route_decisions_total`)."""
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "sy_router_route_decisions"
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels.get("pool") == pool
    )
