"""The worker process: engine, owned partitions, cancels and newer-step notices, heartbeats,
drain on SIGTERM.

When its engine dies (`EngineDead`, from any request: vLLM's engine core is gone), the
worker stops as on SIGTERM, at once: it pulls nothing more on any partition, beats
`draining` right away so the router sends it nothing and moves its partitions, settles
what it holds (the runner answers a request that has streamed tokens with an
`engine_error`, and hands every other back for redelivery), beats a last time without
partitions, deletes its heartbeat and exits with `ENGINE_DEAD_EXIT` (3), so its
supervisor (compose's `restart: unless-stopped`, k8s) starts a fresh one.

It heartbeats, and its probes pass (`services/worker/probes.py`), only once its engine
has answered a warm-up request.
"""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.msg import Msg

from services.worker.gpu import GpuTelemetry
from services.worker.heartbeat import beat
from services.worker.ownership import Ownership
from services.worker.probes import WorkerHealth, warm_up
from services.worker.runner import Runner
from services.worker.settings import WorkerSettings
from switchyard import subjects
from switchyard.answers import answer, result_for
from switchyard.bus.connection import Bus
from switchyard.codec import decode
from switchyard.engines.base import EngineDead
from switchyard.engines.factory import make_engine
from switchyard.errors import DecodeError, ErrorCode
from switchyard.logging import get_logger
from switchyard.messages.inference import ErrorInfo, GenerateRequest, NewestStep
from switchyard.probes import Probes
from switchyard.service import ServiceExit

log = get_logger(__name__)

# The worker's exit status when its engine died: its supervisor restarts it.
ENGINE_DEAD_EXIT = 3


async def run_worker(
    bus: Bus, stop: asyncio.Event, settings: WorkerSettings, probes: Probes | None = None
) -> None:
    """`probes`: the service's (served beside /metrics), which the worker's checks join."""
    health = WorkerHealth(probes if probes is not None else Probes(), settings.liveness_stall)
    engine = make_engine(settings.engine, instances=settings.engine_instances)
    await engine.start()
    health.starting = "warming up: the engine has not answered its warm-up request yet"
    try:
        took = await warm_up(engine)
    except BaseException:
        await engine.close()
        raise
    log.info("worker.warmed_up", engine=engine.kind, seconds=round(took, 3))
    halt = asyncio.Event()  # SIGTERM, or the engine died: stop pulling, settle, leave
    wake = asyncio.Event()  # heartbeat now
    died: list[EngineDead] = []

    def engine_died(exc: EngineDead) -> None:
        died.append(exc)
        log.error("worker.engine_dead", cause=exc.reason, on_engine=len(runner.running))
        halt.set()
        wake.set()

    runner = Runner(bus.nc, bus.js, engine, settings.worker_id, on_engine_dead=engine_died)
    health.serving(runner)

    async def on_work(msg: Msg) -> None:
        req = decode(msg.data, GenerateRequest, max_bytes=settings.max_message_bytes)
        await runner.handle(req, attempt=msg.metadata.num_delivered)

    async def on_give_up(msg: Msg, code: ErrorCode, reason: str) -> None:
        """A request dead-lettered after its last attempt still gets an answer."""
        with contextlib.suppress(DecodeError):
            req = decode(msg.data, GenerateRequest, max_bytes=settings.max_message_bytes)
            result = result_for(req, "error", ErrorInfo(code=code, reason=reason))
            await answer(bus.nc, bus.js, result, req.reply)

    async def on_cancel(msg: Msg) -> None:
        request_id = msg.subject.split(".", 1)[1]
        await runner.cancel(request_id)

    async def on_newest(msg: Msg) -> None:
        with contextlib.suppress(DecodeError):
            notice = decode(msg.data, NewestStep, max_bytes=settings.max_message_bytes)
            runner.observe(notice.tenant, notice.session, notice.step)

    cancels = await bus.nc.subscribe(subjects.CANCEL_ALL, cb=on_cancel)
    newest = await bus.nc.subscribe(subjects.SUPERSEDE_ALL, cb=on_newest)
    ownership = Ownership(bus.js, settings, on_work, on_give_up)
    beat_stop = asyncio.Event()
    gpu = GpuTelemetry.open(settings.gpus)
    heartbeat = asyncio.create_task(
        beat(
            bus.js, settings, engine,
            lambda: (ownership.partitions, ownership.inflight(), halt.is_set()),
            beat_stop, wake, gpu,
        )
    )  # fmt: skip
    signalled = asyncio.create_task(_relay(stop, halt, wake))
    log.info("worker.ready", engine=engine.kind, pool=settings.pool, mode=settings.assignment)
    try:
        await ownership.run(halt)  # returns once in-flight work is drained (or handed back)
    finally:
        signalled.cancel()
        beat_stop.set()
        with contextlib.suppress(Exception):
            await heartbeat
        for sub in (cancels, newest):
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        await engine.close()
        if gpu is not None:
            gpu.close()
    if died:
        raise ServiceExit(ENGINE_DEAD_EXIT, f"the engine died: {died[0].reason}")


async def _relay(stop: asyncio.Event, halt: asyncio.Event, wake: asyncio.Event) -> None:
    """SIGTERM halts the worker too, and says so in a heartbeat at once."""
    await stop.wait()
    halt.set()
    wake.set()
