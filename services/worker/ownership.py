"""Which WORK partitions this worker serves, and one pull loop per owned partition.

In `kv` mode the router decides: the worker watches KV `fleet_assignments`
(keys `<pool>.p<k>`) and binds to exactly the partitions assigned to it,
unbinding (with a drain) those moved away. In `static` mode it owns the
partitions from its settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from services.worker import metrics
from services.worker.settings import WorkerSettings
from switchyard import subjects
from switchyard.backoff import Backoff
from switchyard.bus.consumer import GiveUp, PullLoop, RetryPolicy
from switchyard.bus.kvkeys import kv_keys
from switchyard.bus.publish import UNAVAILABLE
from switchyard.bus.topology import ASSIGNMENTS_BUCKET, WORKERS_BUCKET
from switchyard.codec import decode
from switchyard.errors import DecodeError
from switchyard.logging import get_logger
from switchyard.messages.fleet import Assignment, WorkerHeartbeat, assignment_key

log = get_logger(__name__)

# Between reads of the assignment while its bucket has no leader (a cluster failover).
ASSIGNMENT_RETRY = Backoff(first=0.5, cap=4.0)


class Ownership:
    def __init__(
        self,
        js: JetStreamContext,
        settings: WorkerSettings,
        handler: Callable[[Msg], Awaitable[None]],
        on_give_up: GiveUp | None = None,
    ) -> None:
        self.js = js
        self.s = settings
        self.handler = handler
        self.on_give_up = on_give_up
        self.loops: dict[int, tuple[PullLoop, asyncio.Task[None]]] = {}
        self._failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def partitions(self) -> list[int]:
        return sorted(self.loops)

    def inflight(self) -> int:
        return sum(loop.inflight for loop, _ in self.loops.values())

    def _bind(self, partition: int) -> None:
        if partition in self.loops:
            return
        loop = PullLoop(
            self.js,
            "WORK",
            subjects.work_consumer(self.s.pool, partition),
            self.handler,
            retry=RetryPolicy(max_deliver=self.s.max_attempts + 1),
            ack_wait=self.s.work_ack_wait,
            max_inflight=self.s.credit,
            drain_timeout=self.s.drain_timeout,
            on_give_up=self.on_give_up,
        )
        task = asyncio.create_task(loop.run())
        task.add_done_callback(self._check_loop)
        self.loops[partition] = (loop, task)
        metrics.PARTITIONS.set(len(self.loops))
        log.debug("worker.bound", partition=partition)

    def _check_loop(self, task: asyncio.Task[None]) -> None:
        """A pull loop that dies (consumer missing, ...) takes the worker down loudly."""
        if task.cancelled() or task.exception() is None or self._failure.done():
            return
        self._failure.set_exception(task.exception())  # type: ignore[arg-type]

    async def _until(self, stop: asyncio.Event) -> None:
        """Wait for `stop`, or raise the first pull-loop failure."""
        stopping = asyncio.ensure_future(stop.wait())
        waiting: set[asyncio.Future[Any]] = {stopping, self._failure}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if self._failure.done():
            self._failure.result()

    async def _unbind(self, partition: int) -> None:
        entry = self.loops.pop(partition, None)
        if entry is None:
            return
        loop, task = entry
        loop.stop()
        with contextlib.suppress(Exception):
            await task  # a failed loop already raised through `_until`
        metrics.PARTITIONS.set(len(self.loops))
        log.debug("worker.unbound", partition=partition)

    async def set_owned(self, wanted: set[int]) -> None:
        gone = sorted(set(self.loops) - wanted)
        await asyncio.gather(*(self._unbind(p) for p in gone))
        new = wanted - set(self.loops)
        if new and self.s.assignment == "kv":
            new = await self._handed_over(new)
        for p in sorted(new):
            self._bind(p)
        if gone or new:
            log.info("worker.owns", partitions=self.partitions, released=gone, took=sorted(new))

    async def _handed_over(self, partitions: set[int]) -> set[int]:
        """Wait until no other live worker still pulls these partitions.

        The router moves a partition by rewriting its owner; the old owner stops
        pulling when it sees that, and says so in its next heartbeat. Binding
        before then would let two workers serve one partition, splitting its
        sessions (and their prefix caches) between them.
        """
        kv = await self.js.key_value(WORKERS_BUCKET)
        deadline = time.monotonic() + self.s.handoff_timeout
        while time.monotonic() < deadline:
            claimed: set[int] = set()
            now = time.time()
            for key in await kv_keys(self.js, WORKERS_BUCKET):
                if key == self.s.worker_id:
                    continue
                with contextlib.suppress(KeyNotFoundError, DecodeError):
                    entry = await kv.get(key)
                    beat = decode(entry.value or b"", WorkerHeartbeat)
                    fresh = now - beat.at < 3 * self.s.heartbeat_interval
                    if beat.pool == self.s.pool and fresh:
                        claimed |= set(beat.partitions) & partitions
            if not claimed:
                return partitions
            await asyncio.sleep(self.s.heartbeat_interval / 2)
        log.warning("worker.handoff_timeout", partitions=sorted(partitions))
        return partitions

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the assignment until `stop`; then drain every partition."""
        try:
            if self.s.assignment == "static":
                owned = set(self.s.partitions_owned) or set(range(self.s.partitions))
                await self.set_owned(owned)
                await self._until(stop)
            else:
                await self._follow_kv(stop)
        finally:
            await asyncio.gather(*(self._unbind(p) for p in list(self.loops)))

    async def _follow_kv(self, stop: asyncio.Event) -> None:
        kv = await self.js.key_value(ASSIGNMENTS_BUCKET)
        await self.set_owned(await self._assigned(kv))
        watcher = await kv.watch(f"{self.s.pool}.>")
        stopping = asyncio.create_task(stop.wait())
        unreadable = 0  # assignment reads failed in a row
        try:
            while not stop.is_set():
                update = asyncio.create_task(watcher.updates(timeout=5))  # type: ignore[no-untyped-call]
                waiting: set[asyncio.Future[Any]] = {update, stopping, self._failure}
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if self._failure.done():
                    update.cancel()
                    self._failure.result()
                if stopping in done:
                    update.cancel()
                    with contextlib.suppress(BaseException):
                        await update
                    break
                with contextlib.suppress(Exception):
                    update.result()
                # Re-read the whole assignment: cheap (<= a few hundred keys), and
                # immune to missed or reordered watch events. A read that fails (the
                # bucket has no leader for a moment on a cluster) keeps what is owned:
                # the next update or the 5 s timeout reads it again.
                try:
                    await self.set_owned(await self._assigned(kv))
                    unreadable = 0
                except UNAVAILABLE as exc:
                    log.warning("worker.assignment_unreadable", error=repr(exc))
                    await asyncio.sleep(ASSIGNMENT_RETRY.delay(unreadable))
                    unreadable += 1
        finally:
            stopping.cancel()
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]

    async def _assigned(self, kv: KeyValue) -> set[int]:
        mine: set[int] = set()
        for p in range(self.s.partitions):
            try:
                entry = await kv.get(assignment_key(self.s.pool, p))
            except KeyNotFoundError:
                continue
            if entry.value is None:
                continue
            try:
                assignment = decode(entry.value, Assignment)
            except DecodeError as exc:
                log.warning("worker.bad_assignment", partition=p, reason=exc.reason)
                continue
            if assignment.worker == self.s.worker_id:
                mine.add(p)
        return mine
