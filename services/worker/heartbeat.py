"""Heartbeats to KV `fleet_workers`: the router's view of this worker's health and load.

The bucket's TTL expires a dead worker's entry; the router then moves its partitions.
A worker that stops (SIGTERM, or its engine died) says so at once (`wake`): a beat
marked draining, then, once its partitions are let go, a last one without them before
its entry is deleted, so the router moves them without waiting for the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from nats.js import JetStreamContext

from services.worker import metrics
from services.worker.gpu import GpuTelemetry
from services.worker.settings import WorkerSettings
from switchyard.bus.topology import WORKERS_BUCKET
from switchyard.codec import encode
from switchyard.engines.base import Engine
from switchyard.logging import get_logger
from switchyard.messages.fleet import WorkerHeartbeat

log = get_logger(__name__)


def snapshot(
    settings: WorkerSettings, engine: Engine, partitions: list[int], queued: int, draining: bool
) -> WorkerHeartbeat:
    stats = engine.stats()
    metrics.observe_engine(settings.worker_id, settings.pool, engine.kind, stats)
    return WorkerHeartbeat(
        worker=settings.worker_id,
        pool=settings.pool,
        engine=engine.kind,
        at=time.time(),
        partitions=partitions,
        slots=engine.slots,
        running=stats.running,
        waiting=stats.waiting,
        queued=queued,
        kv_cache_usage=min(1.0, max(0.0, stats.kv_cache_usage)),
        kv_capacity_tokens=max(0, stats.kv_capacity_tokens),
        prefix_hit_rate=min(1.0, max(0.0, stats.prefix_hit_rate)),
        draining=draining,
        role=settings.worker_role,
        topology=settings.worker_topology,
    )


async def beat(
    js: JetStreamContext,
    settings: WorkerSettings,
    engine: Engine,
    state: Callable[[], tuple[list[int], int, bool]],
    stop: asyncio.Event,
    wake: asyncio.Event | None = None,
    gpu: GpuTelemetry | None = None,
) -> None:
    """Put a heartbeat every interval, and at once when `wake` is set, until `stop`; then
    a last one and delete ours (a clean exit). Each beat also reads `gpu`'s telemetry for
    /metrics, in a thread: NVML blocks while it samples PCIe throughput."""
    kv = await js.key_value(WORKERS_BUCKET)
    wake = wake or asyncio.Event()
    while True:
        last = stop.is_set()
        if gpu is not None:
            metrics.GPU.update(await asyncio.to_thread(gpu.read))
        partitions, queued, draining = state()
        try:
            await kv.put(
                settings.worker_id, encode(snapshot(settings, engine, partitions, queued, draining))
            )
        except Exception as exc:  # NATS hiccup: the next beat retries; TTL covers a long outage
            log.warning("worker.heartbeat_failed", error=str(exc))
        if last:
            break
        waits = [asyncio.ensure_future(e.wait()) for e in (stop, wake)]
        await asyncio.wait(waits, timeout=settings.heartbeat_interval,
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        for w in waits:
            w.cancel()
        wake.clear()
    with contextlib.suppress(Exception):
        await kv.delete(settings.worker_id)
