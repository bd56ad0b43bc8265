"""The worker's probes (`services/worker/probes.py`) on its metrics port, with the real
sim engine (and llama.cpp for the warm-up) in a worker process on a real nats-server:

- `/startupz` and `/readyz` fail until the engine has answered its warm-up request (and
  it sends no heartbeat until then), and pass after;
- `/readyz` fails once SIGTERM starts the drain, and while NATS is unreachable;
- `/healthz` fails while the engine holds a request without progress for
  `SY_LIVENESS_STALL` seconds, and passes while it is idle, however long.

The engine dying flips `/readyz` before the worker exits: test_worker_engine_death.py.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest

from services.worker.probes import warm_up
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.bus.reply import cancel
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.engines.llamacpp import LlamaCppEngine, LlamaCppSettings
from switchyard.fleet.processes import Child
from switchyard.messages.inference import ChatMessage, GenerateRequest, Sampling, TokenFrame
from switchyard.ports import free_port
from tests.support.fleet import heartbeat, provision_pool, work_subject, worker_process
from tests.support.poll import until
from tests.support.probes import probe
from tests.support.proxy import CuttableProxy

STEP = 2.0  # s of every sim step in the start-up test (SY_SIM_STEP_OVERHEAD): a slow warm-up


async def passes(child: Child, port: int, path: str) -> bool:
    child.check()
    return (await probe(port, path))[0] == 200


async def fails(child: Child, port: int, path: str, check: str, says: str) -> bool:
    """Whether `path` answers 503 with its check `check` saying `says`."""
    child.check()
    status, body = await probe(port, path)
    return status == 503 and says in body["checks"].get(check, "")


@pytest.fixture
async def pool(bus: Bus, unique: str) -> str:
    name = f"pr{unique}"
    await provision_pool(bus.js, name)
    return name


@pytest.fixture
def port() -> int:
    return free_port()


def sim_worker(nats_url: str, pool: str, port: int, **env: str) -> Any:
    return worker_process(
        nats_url, SY_ENGINE="sim", SY_POOL=pool, SY_WORKER_ID=f"{pool}-w0",
        SY_ASSIGNMENT="static", SY_PARTITIONS="4", SY_METRICS_PORT=str(port),
        SY_HEARTBEAT_INTERVAL="0.3", **env,
    )  # fmt: skip


def chat(pool: str, text: str, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(
        tenant="acme", workload="llm", pool=pool, stream=True,
        messages=[ChatMessage(role="user", content=text)],
        sampling=Sampling(max_tokens=max_tokens),
    )  # fmt: skip


class Stream:
    """One request sent to its WORK partition, its frames collected as they come."""

    def __init__(self, bus: Bus, req: GenerateRequest) -> None:
        self.bus, self.req = bus, req
        self.frames: list[TokenFrame] = []
        self.task: asyncio.Task[None] | None = None

    async def send(self) -> None:
        reader = TokenStreamReader(self.bus.nc, idle_timeout=120)
        await reader.__aenter__()
        sent = self.req.model_copy(update={"reply": reader.inbox})

        async def collect() -> None:
            try:
                async for frame in reader:
                    self.frames.append(frame)
            finally:
                await reader.__aexit__(None, None, None)

        self.task = asyncio.create_task(collect())
        await publish(self.bus.js, work_subject(sent), sent)

    def final(self) -> TokenFrame | None:
        return next((f for f in self.frames if f.type != "delta"), None)


async def test_startup_waits_for_the_warm_up_and_readiness_ends_with_the_drain(
    bus: Bus, nats_url: str, pool: str, port: int
) -> None:
    wid = f"{pool}-w0"
    with sim_worker(nats_url, pool, port, SY_SIM_STEP_OVERHEAD=str(STEP)) as child:
        warming = "warming up"
        window: list[tuple[int, dict[str, Any], object]] = []

        async def seen_warming() -> bool:
            """readyz and the heartbeat, looked at between two startupz saying warming up."""
            if not await fails(child, port, "startupz", "engine", warming):
                return False
            status, body = await probe(port, "readyz")
            beat = await heartbeat(bus.js, wid)
            if await fails(child, port, "startupz", "engine", warming):
                window.append((status, body, beat))
            return bool(window)

        await until(seen_warming, timeout=60, what="the engine seen warming up")
        ((status, body, beat),) = window
        assert status == 503 and warming in body["checks"]["engine"], body
        assert beat is None, "no heartbeat before the engine answered its warm-up"
        await until(lambda: passes(child, port, "startupz"), timeout=30,
                    what="startupz passing once warmed up")  # fmt: skip
        status, body = await probe(port, "readyz")
        assert status == 200 and body == {"ok": True, "checks": {
            "bus": "ok", "stopping": "ok", "engine": "ok"}}, body  # fmt: skip
        assert (await probe(port, "healthz"))[0] == 200

        # A request takes three steps (6 s); SIGTERM while it runs: not ready any more,
        # still live (the engine makes progress), and the request is finished.
        stream = Stream(bus, chat(pool, "hello", max_tokens=3))
        await stream.send()
        await until(lambda: bool(stream.frames), timeout=30, what="the first token")
        child.proc.send_signal(signal.SIGTERM)
        await until(lambda: fails(child, port, "readyz", "stopping", "draining"), timeout=10,
                    what="readyz failing once the drain starts")  # fmt: skip
        assert (await probe(port, "healthz"))[0] == 200
        assert stream.final() is None, "the drain was seen before the request ended"
        await until(lambda: stream.final() is not None, timeout=30, what="the request answered")
        final = stream.final()
        assert final is not None and final.type == "end" and final.result is not None
        assert final.result.status == "ok"
        assert await asyncio.to_thread(child.proc.wait, 30) == 0


async def test_readiness_fails_while_nats_is_unreachable(
    bus: Bus, nats_url: str, pool: str, port: int
) -> None:
    proxy = CuttableProxy(upstream_port=urlparse(nats_url).port or 4222)
    await proxy.open()
    try:
        with sim_worker(proxy.url, pool, port) as child:
            await until(lambda: passes(child, port, "readyz"), timeout=60, what="ready")
            await proxy.cut()
            await until(lambda: fails(child, port, "readyz", "bus", "NATS disconnected"),
                        timeout=10, what="readyz failing with its bus cut")  # fmt: skip
            status, body = await probe(port, "healthz")
            assert status == 200, body  # a restart would not bring NATS back
            await proxy.open()
            await until(lambda: passes(child, port, "readyz"), timeout=30,
                        what="ready again once NATS is back")  # fmt: skip
    finally:
        await proxy.cut()


async def test_liveness_fails_while_the_engine_stalls_holding_work_not_while_idle(
    bus: Bus, nats_url: str, pool: str, port: int
) -> None:
    # 10 ms a prompt token: the warm-up's few tokens take a fraction of a second, a
    # prompt of 6,000 words one step of a minute with no token out.
    env = {"SY_SIM_PREFILL_COST_PER_TOKEN": "0.01", "SY_LIVENESS_STALL": "1"}
    with sim_worker(nats_url, pool, port, **env) as child:
        await until(lambda: passes(child, port, "startupz"), timeout=60, what="started")
        await asyncio.sleep(2.5)  # proving a negative: idle for longer than the stall limit
        status, body = await probe(port, "healthz")
        assert status == 200 and body["checks"]["engine"] == "ok", body

        # A long answer, a token each step (~13 ms): live all along, longer than the limit.
        answer = Stream(bus, chat(pool, "hello", max_tokens=300))
        started = time.monotonic()
        await answer.send()
        looks: list[int] = []

        async def answered() -> bool:
            looks.append((await probe(port, "healthz"))[0])
            return answer.final() is not None

        await until(answered, timeout=60, what="the long answer")
        assert time.monotonic() - started > 1.0 and set(looks) == {200}, looks

        stream = Stream(bus, chat(pool, "word " * 6000, max_tokens=4))
        await stream.send()
        await until(lambda: fails(child, port, "healthz", "engine", "no progress"), timeout=30,
                    what="healthz failing while the engine holds a request, stalled")  # fmt: skip
        _, body = await probe(port, "healthz")
        assert "holding 1 request(s)" in body["checks"]["engine"], body
        assert (await probe(port, "readyz"))[0] == 200  # stalled is not unready: it is dead

        await cancel(bus.nc, "acme", stream.req.id, "test: unstick the engine")
        await until(lambda: passes(child, port, "healthz"), timeout=30,
                    what="healthz passing once the request left the engine")  # fmt: skip
        await until(lambda: stream.final() is not None, timeout=30, what="the cancel answered")
        final = stream.final()
        assert final is not None and final.result is not None
        assert final.result.status == "cancelled"


@pytest.fixture
def llamacpp() -> Iterator[LlamaCppEngine]:
    yield LlamaCppEngine(LlamaCppSettings())


async def test_llamacpp_answers_the_warm_up(llamacpp: LlamaCppEngine) -> None:
    await llamacpp.start()
    try:
        assert await warm_up(llamacpp) > 0
        assert llamacpp.stats().prefix_queried_tokens > 0  # the prompt really ran
    finally:
        await llamacpp.close()
