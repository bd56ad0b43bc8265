"""The worker whose engine dies (`EngineDead`), with a test double for the engine.

A request that has streamed tokens to its client is answered once with `engine_error`;
every other is handed back (naked) and answered by the worker its partition goes to;
the dying worker stops pulling, beats `draining` at once, then one last time without
partitions, deletes its heartbeat and exits with `ENGINE_DEAD_EXIT`; its `/readyz` fails
from the death on, before it exits. The real engine (vLLM's EngineCore killed under load)
is `tests/vllm/test_engine_death.py`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
from nats.aio.msg import Msg

import services.worker.service as worker_service
from services.worker.probes import WARM_UP
from services.worker.runner import Runner
from services.worker.service import ENGINE_DEAD_EXIT, run_worker
from services.worker.settings import WorkerSettings
from switchyard.bus.connection import Bus, connect
from switchyard.bus.publish import publish
from switchyard.bus.topology import WORKERS_BUCKET
from switchyard.codec import decode
from switchyard.engines.base import (
    Capabilities,
    Delta,
    EngineDead,
    EngineKind,
    EngineRequest,
    EngineStats,
    ModelInfo,
)
from switchyard.errors import TransientError
from switchyard.messages.fleet import WorkerHeartbeat
from switchyard.messages.inference import (
    ChatMessage,
    GenerateRequest,
    GenerateResult,
    Sampling,
    TokenFrame,
)
from switchyard.ports import free_port
from switchyard.probes import Probes
from switchyard.service import ServiceExit, serve
from tests.support.fleet import provision_pool, work_subject, worker_in_process
from tests.support.poll import until
from tests.support.probes import probe

TALK = "talk"  # a prompt starting so makes the double stream a token before it dies


class DyingEngine:
    """Answers the worker's warm-up; holds every other request until `die` is set, then
    raises `EngineDead` in all of them; one whose prompt starts with TALK has produced a
    token by then. `close` waits for `may_close` (a slow engine shutdown)."""

    kind: EngineKind = "sim"
    capabilities = Capabilities(vision=False, json_schema=False, grammar=False, regex=False,
                                lora=False, max_context=4096)  # fmt: skip
    slots = 8
    model = ModelInfo("dying", "test-double")

    def __init__(self) -> None:
        self.die = asyncio.Event()
        self.may_close = asyncio.Event()
        self.may_close.set()
        self.entered: set[str] = set()

    async def start(self) -> None:
        return None

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        if request.request_id == WARM_UP.request_id:
            yield Delta("OK", 1, prompt_tokens=3, finish_reason="stop")
            return
        self.entered.add(request.request_id)
        if self.die.is_set():
            raise EngineDead("engine core died (test double)")
        content = request.messages[0].content if request.messages else ""
        if isinstance(content, str) and content.startswith(TALK):
            yield Delta("Hello", 1, prompt_tokens=3)
        await self.die.wait()
        raise EngineDead("engine core died (test double)")

    async def abort(self, request_id: str) -> None:
        return None

    def stats(self) -> EngineStats:
        return EngineStats()

    async def close(self) -> None:
        await self.may_close.wait()


def chat(pool: str, tenant: str, text: str, *, stream: bool = True, **kw: Any) -> GenerateRequest:
    return GenerateRequest(
        tenant=tenant, workload="llm", pool=pool, stream=stream,
        messages=[ChatMessage(role="user", content=text)],
        sampling=Sampling(max_tokens=8, temperature=0.0, seed=1), **kw,
    )  # fmt: skip


class Frames:
    """Every frame of every request's reply inbox, and the results on RES."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.frames: dict[str, list[TokenFrame]] = defaultdict(list)
        self.results: Counter[str] = Counter()
        self.last: dict[str, GenerateResult] = {}

    async def watch_res(self, tenant: str) -> Any:
        async def on_res(msg: Msg) -> None:
            result = decode(msg.data, GenerateResult)
            self.results[result.request_id] += 1
            self.last[result.request_id] = result

        return await self.bus.js.subscribe(f"res.llm.{tenant}", cb=on_res, ordered_consumer=True)

    async def inbox(self, rid: str) -> str:
        inbox = self.bus.nc.new_inbox()

        async def on_frame(msg: Msg) -> None:
            self.frames[rid].append(decode(msg.data, TokenFrame))

        await self.bus.nc.subscribe(inbox, cb=on_frame)
        return inbox

    def finals(self, rid: str) -> list[TokenFrame]:
        return [f for f in self.frames[rid] if f.type != "delta"]

    def streamed(self, rid: str) -> bool:
        return any(f.type == "delta" for f in self.frames[rid])


async def test_runner_answers_begun_and_hands_back_the_rest(bus: Bus, unique: str) -> None:
    pool, tenant = f"d{unique}", f"t{unique}"
    await provision_pool(bus.js, pool)
    seen = Frames(bus)
    res = await seen.watch_res(tenant)
    engine = DyingEngine()
    deaths: list[EngineDead] = []
    runner = Runner(bus.nc, bus.js, engine, "w-dying", on_engine_dead=deaths.append)
    begun = chat(pool, tenant, f"{TALK}: streamed a token")
    silent = chat(pool, tenant, "no token yet")  # e.g. still in prefill
    quiet = chat(pool, tenant, f"{TALK}, but not streamed", stream=False)
    reqs = [r.model_copy(update={"reply": await seen.inbox(r.id)}) for r in (begun, silent, quiet)]
    begun, silent, quiet = reqs
    tasks = {r.id: asyncio.create_task(runner.handle(r)) for r in reqs}
    await until(lambda: engine.entered == {r.id for r in reqs} and seen.streamed(begun.id),
                timeout=10, what="all three on the engine, one streaming")  # fmt: skip
    engine.die.set()
    await asyncio.wait(tasks.values(), timeout=10)
    assert all(t.done() for t in tasks.values())

    # Begun: answered once, an engine_error saying the engine died mid-answer.
    assert tasks[begun.id].exception() is None
    await until(lambda: seen.results[begun.id] == 1 and len(seen.finals(begun.id)) == 1,
                timeout=10, what="the begun request's answer")  # fmt: skip
    (final,) = seen.finals(begun.id)
    assert final.type == "error" and final.error is not None
    assert final.error.code == "engine_error" and "died mid-answer" in final.error.reason
    assert seen.last[begun.id].status == "error"
    # Not begun (no token to its client, streaming or not): handed back, unanswered.
    for r in (silent, quiet):
        exc = tasks[r.id].exception()
        assert isinstance(exc, TransientError) and exc.code == "engine_error", exc
    assert len(deaths) == 1  # the worker is told once, whichever request saw it first

    # Pulled after the death: handed back without touching the engine.
    late = chat(pool, tenant, f"{TALK} late")
    late = late.model_copy(update={"reply": await seen.inbox(late.id)})
    with pytest.raises(TransientError):
        await runner.handle(late)
    assert late.id not in engine.entered
    await asyncio.sleep(0.5)  # proving a negative: no answer shows up for the handed back
    for r in (silent, quiet, late):
        assert seen.results[r.id] == 0 and not seen.finals(r.id)
    await res.unsubscribe()


async def test_worker_exits_3_and_its_work_moves(
    bus: Bus, unique: str, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool, tenant = f"d{unique}", f"t{unique}"
    await provision_pool(bus.js, pool)
    seen = Frames(bus)
    res = await seen.watch_res(tenant)
    engine = DyingEngine()
    real_make_engine = worker_service.make_engine
    made: list[str] = []

    def make_engine(*args: Any, **kw: Any) -> Any:  # the double first, then real ones
        made.append("engine")
        return engine if len(made) == 1 else real_make_engine(*args, **kw)

    monkeypatch.setattr(worker_service, "make_engine", make_engine)
    wid = f"{pool}-dying"
    # A long interval: a beat within a second of the death is the one it wakes.
    settings = WorkerSettings(
        nats_url=nats_url, worker_id=wid, pool=pool, assignment="static", partitions=4,
        heartbeat_interval=5.0,
    )  # fmt: skip
    beats: list[tuple[float, WorkerHeartbeat | None]] = []
    kv = await bus.js.key_value(WORKERS_BUCKET)
    watcher = await kv.watch(wid)

    async def watch() -> None:
        async for entry in watcher:
            if entry is None:  # the end of the initial values
                continue
            value = decode(entry.value, WorkerHeartbeat) if entry.value else None
            beats.append((time.monotonic(), value))

    watching = asyncio.create_task(watch())
    worker_bus = await connect(settings, f"test-{wid}")
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(worker_bus, stop, settings))
    reqs = [chat(pool, tenant, f"{TALK} {i}", session=f"s{i}") for i in range(4)]
    reqs += [chat(pool, tenant, f"quiet {i}", session=f"q{i}") for i in range(4)]
    reqs += [chat(pool, tenant, f"{TALK} unstreamed {i}", session=f"u{i}", stream=False)
             for i in range(2)]  # fmt: skip
    for r in reqs:
        sent = r.model_copy(update={"reply": await seen.inbox(r.id)})
        await publish(bus.js, work_subject(sent), sent)
    talkers = [r for r in reqs if r.stream and r.messages and TALK in str(r.messages[0].content)]
    await until(lambda: engine.entered == {r.id for r in reqs}
                and all(seen.streamed(r.id) for r in talkers),
                timeout=20, what="every request on the engine")  # fmt: skip
    died_at = time.monotonic()
    engine.die.set()
    with pytest.raises(ServiceExit) as exit_:
        await asyncio.wait_for(worker, timeout=20)
    assert exit_.value.code == ENGINE_DEAD_EXIT == 3
    assert "engine died" in exit_.value.reason
    await worker_bus.close()
    await until(lambda: bool(beats) and beats[-1][1] is None, timeout=5,
                what="the dead worker's heartbeat deleted")  # fmt: skip
    after = [(t, hb) for t, hb in beats if t >= died_at]
    first = next(hb for _, hb in after if hb is not None)
    assert first.draining, "the death is told at once, as a draining beat"
    assert after[0][0] - died_at < 2.0, "not a scheduled beat (5 s interval)"
    last = [hb for _, hb in after if hb is not None][-1]
    assert last.draining and last.partitions == []
    for r in reqs:
        if r in talkers:
            continue
        assert seen.results[r.id] == 0, "handed back, not answered by the dead worker"

    # Another worker takes the partitions over and answers what was handed back.
    async with worker_in_process(nats_url, worker_id=f"{pool}-next", pool=pool, engine="sim"):
        await until(lambda: all(len(seen.finals(r.id)) >= 1 for r in reqs), timeout=30,
                    what="every request answered")  # fmt: skip
        await asyncio.sleep(1.0)  # proving a negative: no second answer shows up
    watching.cancel()
    await res.unsubscribe()
    for r in reqs:
        assert seen.results[r.id] == 1, (r.id, seen.results[r.id])
        (final,) = seen.finals(r.id)
        if r in talkers:
            assert final.type == "error" and final.error is not None
            assert final.error.code == "engine_error"
            assert seen.last[r.id].worker == wid
        else:
            assert final.type == "end" and final.result is not None
            assert final.result.status == "ok" and final.result.worker == f"{pool}-next"
            assert final.attempt == 2  # the redelivery


async def test_readiness_fails_from_the_death_until_the_exit(
    bus: Bus, unique: str, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool, tenant = f"d{unique}", f"t{unique}"
    await provision_pool(bus.js, pool)
    engine = DyingEngine()
    engine.may_close.clear()  # the exit waits for the engine's shutdown, which waits for us
    monkeypatch.setattr(worker_service, "make_engine", lambda *args, **kw: engine)
    port = free_port()
    settings = WorkerSettings(
        nats_url=nats_url, worker_id=f"{pool}-dying", pool=pool, assignment="static",
        partitions=4, metrics_port=port,
    )  # fmt: skip
    probes = Probes()  # as `python -m services.worker` runs it: the service's and the worker's
    main = partial(run_worker, settings=settings, probes=probes)
    served = asyncio.create_task(serve(f"test-{settings.worker_id}", settings, main, probes))

    async def ready() -> bool:
        return (await probe(port, "readyz"))[0] == 200

    await until(ready, timeout=30, what="the worker ready")
    req = chat(pool, tenant, "quiet", session="s0")
    await publish(bus.js, work_subject(req), req)
    await until(lambda: req.id in engine.entered, timeout=20, what="the request on the engine")
    engine.die.set()

    async def says_dead() -> bool:
        status, body = await probe(port, "readyz")
        return status == 503 and "the engine died" in body["checks"]["engine"]

    await until(says_dead, timeout=10, what="readyz failing after the engine died")
    assert not served.done(), "seen before the worker exits"
    engine.may_close.set()
    with pytest.raises(ServiceExit) as exit_:
        await asyncio.wait_for(served, timeout=20)
    assert exit_.value.code == ENGINE_DEAD_EXIT
