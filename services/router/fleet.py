"""The router's view of the fleet: live workers from heartbeats, partition owners in KV.

Assignments are written with compare-and-set on the key's revision, so several
router replicas never overwrite each other's decision with a stale one: a
failed CAS reloads the stored assignment and the next round decides again.
"""

from __future__ import annotations

import contextlib
import time

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from switchyard.bus.kvkeys import kv_keys
from switchyard.bus.topology import ASSIGNMENTS_BUCKET, WORKERS_BUCKET
from switchyard.codec import decode, encode
from switchyard.errors import DecodeError
from switchyard.logging import get_logger
from switchyard.messages.fleet import Assignment, WorkerHeartbeat, assignment_key
from switchyard.scheduling.placement import Move, Placement, WorkerView

log = get_logger(__name__)


class FleetNotOpen(RuntimeError):
    """A KV read or write before `Fleet.open()`: the router's wiring is wrong."""


def _opened(kv: KeyValue | None) -> KeyValue:
    if kv is None:
        raise FleetNotOpen("Fleet.open() must be awaited first")
    return kv


class Fleet:
    def __init__(self, js: JetStreamContext, dead_after: float) -> None:
        self.js = js
        self.dead_after = dead_after
        self.workers: dict[str, WorkerHeartbeat] = {}
        self.heard: dict[str, float] = {}  # worker -> when a result of it was last heard
        self._workers_kv: KeyValue | None = None
        self._assign_kv: KeyValue | None = None
        self._revisions: dict[str, int] = {}

    async def open(self) -> None:
        self._workers_kv = await self.js.key_value(WORKERS_BUCKET)
        self._assign_kv = await self.js.key_value(ASSIGNMENTS_BUCKET)

    async def refresh_workers(self) -> None:
        workers_kv = _opened(self._workers_kv)
        keys = await kv_keys(self.js, WORKERS_BUCKET)
        # A worker missed for one refresh would lose its partitions (and its warm caches):
        # ask for every known worker by name too, so only a real miss drops it.
        keys = [*keys, *(k for k in self.workers if k not in keys)]
        seen: dict[str, WorkerHeartbeat] = {}
        for key in keys:
            with contextlib.suppress(KeyNotFoundError):
                entry = await workers_kv.get(key)
                if entry.value:
                    try:
                        seen[key] = decode(entry.value, WorkerHeartbeat)
                    except DecodeError as exc:
                        log.warning("router.bad_heartbeat", worker=key, reason=exc.reason)
        self.workers = seen

    def location(self, worker: str) -> str:
        """Where `worker`'s GPU sits, as its last heartbeat says (empty: unknown)."""
        beat = self.workers.get(worker)
        return beat.topology if beat is not None else ""

    def heard_from(self, worker: str, at: float) -> None:
        """A result `worker` published was heard at `at`: it is alive."""
        self.heard[worker] = max(at, self.heard.get(worker, 0.0))

    def live(self, pool: str, now: float | None = None) -> list[WorkerHeartbeat]:
        """The workers of `pool` heard from within `dead_after`: by their heartbeat, or by
        a result. A worker answering is alive, however late its heartbeat: on a busy CPU
        a heartbeat (every 2 s) lagged past 6 s declared workers dead that were answering
        steps all along, and moved their sessions (`sy bench route --workload agent`: 20-40
        of 4,000 steps on a 2-core machine shared with other runs)."""
        now = time.time() if now is None else now
        heard = self.heard
        return [
            hb for hb in self.workers.values()
            if hb.pool == pool and now - max(hb.at, heard.get(hb.worker, 0.0)) <= self.dead_after
        ]  # fmt: skip

    def views(self, pool: str) -> list[WorkerView]:
        return [WorkerView(hb.worker, hb.slots, hb.draining) for hb in self.live(pool)]

    async def load_assignment(self, pool: str, placement: Placement) -> None:
        assign_kv = _opened(self._assign_kv)
        placement.assignment.clear()
        for p in range(placement.partitions):
            key = assignment_key(pool, p)
            try:
                entry = await assign_kv.get(key)
            except KeyNotFoundError:
                self._revisions.pop(key, None)
                continue
            if entry.value and entry.revision is not None:
                with contextlib.suppress(DecodeError):
                    placement.assignment[p] = decode(entry.value, Assignment).worker
                    self._revisions[key] = entry.revision

    async def write(self, pool: str, move: Move) -> bool:
        """CAS-write one move; False if another router changed the key first."""
        assign_kv = _opened(self._assign_kv)
        key = assignment_key(pool, move.partition)
        value = encode(
            Assignment(
                pool=pool, partition=move.partition, worker=move.dst, at=time.time(),
                reason=move.reason,
            )
        )  # fmt: skip
        try:
            if key in self._revisions:
                self._revisions[key] = await assign_kv.update(key, value, last=self._revisions[key])
            else:
                self._revisions[key] = await assign_kv.create(key, value)
        except KeyWrongLastSequenceError:
            return False
        except Exception as exc:  # create() on an existing key raises a bad-request API error
            log.info("router.assignment_conflict", key=key, error=str(exc))
            return False
        return True
