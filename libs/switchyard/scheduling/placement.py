"""Partition placement: partitions -> live workers by consistent hashing with bounded load.

Partitions are the delivery channel: a worker consumes the `WORK` partitions it owns,
and the router sends each request on a partition of the worker it chose for it
(`affinity`: per session, by load in tokens). So a partition's placement only has to
give every live worker its share: a partition keeps its worker unless the worker dies,
drains, or holds more than (1 + epsilon) x its slot share of partitions; only then does
it move, and only as far as needed. Initial placement walks a hash ring from the
partition's point and takes the first worker still under its bounded share, so adding a
worker moves few partitions.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Literal

from switchyard.partition import fnv1a_32

VNODES = 64

MoveReason = Literal["initial", "dead", "drain", "spill"]


@dataclass(frozen=True)
class WorkerView:
    worker: str
    slots: int
    draining: bool = False


@dataclass(frozen=True)
class Move:
    partition: int
    src: str | None
    dst: str
    reason: MoveReason


def _point(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


@dataclass
class Placement:
    partitions: int
    epsilon: float = 0.25
    assignment: dict[int, str] = field(default_factory=dict)

    def owner(self, partition: int) -> str | None:
        return self.assignment.get(partition)

    def holds(self, worker: str) -> bool:
        """Whether `worker` owns any partition (cheaper than `partitions_of` per dispatch)."""
        return worker in self.assignment.values()

    def partitions_of(self, worker: str) -> list[int]:
        return sorted(p for p, w in self.assignment.items() if w == worker)

    def _caps(self, workers: list[WorkerView]) -> dict[str, int]:
        total = sum(w.slots for w in workers)
        return {
            w.worker: math.ceil((1 + self.epsilon) * self.partitions * w.slots / total)
            for w in workers
        }

    def _ring_pick(
        self,
        partition: int,
        workers: list[WorkerView],
        counts: dict[str, int],
        exclude: str | None = None,
    ) -> str:
        caps = self._caps(workers)
        workers = [w for w in workers if w.worker != exclude]
        ring = sorted((_point(f"{w.worker}#{v}"), w.worker) for w in workers for v in range(VNODES))
        start = _point(f"partition-{partition}-{fnv1a_32(str(partition).encode())}")
        idx = next((i for i, (pt, _) in enumerate(ring) if pt >= start), 0)
        for step in range(len(ring)):
            _, worker = ring[(idx + step) % len(ring)]
            if counts.get(worker, 0) < caps[worker]:
                return worker
        return min(workers, key=lambda w: counts.get(w.worker, 0) / w.slots).worker

    def reconcile(self, workers: list[WorkerView]) -> list[Move]:
        """Moves that bring the assignment in line with the live workers."""
        eligible = [w for w in workers if not w.draining]
        if not eligible:
            return []
        live = {w.worker for w in workers}
        draining = {w.worker for w in workers if w.draining}
        counts: dict[str, int] = {}
        for w in self.assignment.values():
            if w in live and w not in draining:
                counts[w] = counts.get(w, 0) + 1
        moves: list[Move] = []
        for p in range(self.partitions):
            current = self.assignment.get(p)
            if current is not None and current in live and current not in draining:
                continue
            reason: MoveReason = (
                "initial" if current is None else "drain" if current in draining else "dead"
            )
            dst = self._ring_pick(p, eligible, counts)
            counts[dst] = counts.get(dst, 0) + 1
            moves.append(Move(p, current, dst, reason))
            self.assignment[p] = dst
        # A joiner takes its share first, from the fullest workers, so no partition
        # moves twice; then anything still over its bound is shed.
        moves += self._fill_shortfall(eligible, counts)
        moves += self._shed_excess(eligible, counts)
        return moves

    def _fill_shortfall(self, workers: list[WorkerView], counts: dict[str, int]) -> list[Move]:
        """A worker with no partitions (one that joined a fleet already under its caps)
        takes partitions from the fullest workers until it holds (1 - epsilon) x its
        share; without this a late joiner would idle until something else moved.
        Workers that hold any partitions are left alone: only joins move partitions here."""
        total = sum(w.slots for w in workers)
        moves: list[Move] = []
        for w in workers:
            if counts.get(w.worker, 0) > 0:
                continue
            floor = math.floor((1 - self.epsilon) * self.partitions * w.slots / total)
            while counts.get(w.worker, 0) < floor:
                donor = max(
                    (o for o in workers if o.worker != w.worker),
                    key=lambda o: counts.get(o.worker, 0) / o.slots,
                    default=None,
                )
                if donor is None or counts.get(donor.worker, 0) <= floor:
                    break
                p = self.partitions_of(donor.worker)[-1]
                counts[donor.worker] -= 1
                counts[w.worker] = counts.get(w.worker, 0) + 1
                self.assignment[p] = w.worker
                moves.append(Move(p, donor.worker, w.worker, "spill"))
        return moves

    def _shed_excess(self, workers: list[WorkerView], counts: dict[str, int]) -> list[Move]:
        """A worker holding more than its bounded share of partitions (e.g. the first of
        several to start) gives the excess to workers under theirs, as a ring walk
        from each partition would choose."""
        caps = self._caps(workers)
        moves: list[Move] = []
        for w in workers:
            for p in reversed(self.partitions_of(w.worker)):
                if counts.get(w.worker, 0) <= caps[w.worker]:
                    break
                others = [o for o in workers if o.worker != w.worker]
                if not others or all(counts.get(o.worker, 0) >= caps[o.worker] for o in others):
                    break
                dst = self._ring_pick(p, workers, counts, exclude=w.worker)
                counts[w.worker] -= 1
                counts[dst] = counts.get(dst, 0) + 1
                self.assignment[p] = dst
                moves.append(Move(p, w.worker, dst, "spill"))
        return moves
