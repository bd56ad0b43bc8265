"""Partition placement: partitions -> live workers by consistent hashing with bounded load.

A partition keeps its worker (its sessions' prefixes live in that worker's KV
cache) unless the worker dies, drains, or carries more than (1 + epsilon) x the
average load; only then does it move, and only as far as needed. Measured load
(tokens, not partition counts) may have its own, usually wider, bound
`spill_epsilon`: a move costs the partition's sessions their warm cache. Initial
placement walks a hash ring from the partition's point and takes the first
worker still under its bounded share, so adding a worker moves few partitions.
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
    spill_cooldown: float = 60.0
    spill_epsilon: float | None = None  # the bound of a load-based spill; None: `epsilon`
    assignment: dict[int, str] = field(default_factory=dict)
    _moved_at: dict[int, float] = field(default_factory=dict)

    def owner(self, partition: int) -> str | None:
        return self.assignment.get(partition)

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

    def reconcile(
        self,
        workers: list[WorkerView],
        load: dict[int, float] | None = None,
        now: float = 0.0,
    ) -> list[Move]:
        """Moves that bring the assignment in line with the live workers (and load)."""
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
            self._moved_at[p] = now
        # A joiner takes its share first, from the fullest workers, so no partition
        # moves twice; then anything still over its bound is shed.
        moves += self._fill_shortfall(eligible, counts, now)
        moves += self._shed_excess(eligible, counts, now)
        if load:
            spill = self._spill(eligible, load, now)
            if spill:
                moves.append(spill)
                self.assignment[spill.partition] = spill.dst
                self._moved_at[spill.partition] = now
        return moves

    def _fill_shortfall(
        self, workers: list[WorkerView], counts: dict[str, int], now: float
    ) -> list[Move]:
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
                self._moved_at[p] = now
                moves.append(Move(p, donor.worker, w.worker, "spill"))
        return moves

    def _shed_excess(
        self, workers: list[WorkerView], counts: dict[str, int], now: float
    ) -> list[Move]:
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
                self._moved_at[p] = now
                moves.append(Move(p, w.worker, dst, "spill"))
        return moves

    def _spill(self, workers: list[WorkerView], load: dict[int, float], now: float) -> Move | None:
        """At most one move per call: the hottest worker gives the coolest the partition
        that best evens it out among those that keep the target under the spill bound.

        Loads are per slot and the mean is the pool's (total load / total slots), the
        same slot weighting as the partition caps; an unweighted mean of per-slot loads
        lets a small worker next to big ones run far past (1 + epsilon) x its share."""
        if len(workers) < 2:
            return None
        slots = {w.worker: w.slots for w in workers}
        per_worker = {
            w.worker: sum(load.get(p, 0.0) for p in self.partitions_of(w.worker)) / w.slots
            for w in workers
        }
        mean = sum(per_worker[w] * slots[w] for w in per_worker) / sum(slots.values())
        if mean <= 0:
            return None
        bound = (1 + (self.epsilon if self.spill_epsilon is None else self.spill_epsilon)) * mean
        hot = max(per_worker, key=lambda w: per_worker[w])
        cool = min(per_worker, key=lambda w: per_worker[w])
        if per_worker[hot] <= bound:
            return None
        want = (per_worker[hot] - mean) * slots[hot]
        candidates = [
            p
            for p in self.partitions_of(hot)
            if now - self._moved_at.get(p, -math.inf) >= self.spill_cooldown
            and load.get(p, 0.0) > 0
            and per_worker[cool] + load[p] / slots[cool] <= bound
        ]
        if not candidates:
            return None
        p = min(candidates, key=lambda c: abs(load[c] - want))
        return Move(p, hot, cool, "spill")
