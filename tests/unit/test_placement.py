"""Placement: bounded-load consistent hashing of partitions onto workers, and its moves."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from switchyard.scheduling.placement import Move, Placement, WorkerView

PARTITIONS = 64


def pool(n: int, slots: int = 1, prefix: str = "w") -> list[WorkerView]:
    return [WorkerView(f"{prefix}{i}", slots) for i in range(n)]


def counts(placement: Placement) -> Counter[str]:
    return Counter(placement.assignment.values())


def caps(workers: list[WorkerView], epsilon: float, partitions: int = PARTITIONS) -> dict[str, int]:
    total = sum(w.slots for w in workers)
    return {w.worker: math.ceil((1 + epsilon) * partitions * w.slots / total) for w in workers}


def placed(workers: list[WorkerView], epsilon: float = 0.25) -> Placement:
    placement = Placement(PARTITIONS, epsilon=epsilon)
    placement.reconcile(workers)
    return placement


def assert_within_caps(placement: Placement, workers: list[WorkerView]) -> None:
    limit = caps(workers, placement.epsilon, placement.partitions)
    held = counts(placement)
    for worker, cap in limit.items():
        assert held[worker] <= cap, (worker, held[worker], cap)


def assert_each_partition_moved_once(moves: list[Move]) -> None:
    moved = [m.partition for m in moves]
    assert len(moved) == len(set(moved)), moves


# --- initial placement ---------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.1, 0.25, 0.5])
def test_initial_placement_spreads_partitions_within_the_bound(epsilon: float) -> None:
    workers = pool(8)
    placement = Placement(PARTITIONS, epsilon=epsilon)
    moves = placement.reconcile(workers)
    assert sorted(m.partition for m in moves) == list(range(PARTITIONS))
    assert all(m.reason == "initial" and m.src is None for m in moves)
    assert {m.partition: m.dst for m in moves} == placement.assignment
    held = counts(placement)
    assert set(held) == {w.worker for w in workers}  # every worker gets some
    assert max(held.values()) <= math.ceil((1 + epsilon) * PARTITIONS / 8)
    assert sum(held.values()) == PARTITIONS


def test_initial_placement_respects_slots() -> None:
    slots = [1, 1, 2, 2, 4, 4, 8, 8]
    workers = [WorkerView(f"w{i}", s) for i, s in enumerate(slots)]
    placement = placed(workers)
    assert len(placement.assignment) == PARTITIONS
    assert_within_caps(placement, workers)
    held = counts(placement)
    by_size = {s: sum(held[w.worker] for w in workers if w.slots == s) for s in set(slots)}
    assert by_size[1] < by_size[2] < by_size[4] < by_size[8]


def test_placement_is_deterministic_and_order_independent() -> None:
    """Several routers must compute the same placement from the same fleet."""
    workers = pool(8)
    first = placed(workers)
    second = placed(list(reversed(workers)))
    assert first.assignment == second.assignment


def test_owner_and_partitions_of() -> None:
    placement = placed(pool(8))
    for worker in ("w0", "w5"):
        mine = placement.partitions_of(worker)
        assert mine == sorted(mine)
        assert all(placement.owner(p) == worker for p in mine)
    assert placement.owner(PARTITIONS + 1) is None
    assert placement.partitions_of("nobody") == []


# --- stability and failures ----------------------------------------------------------


def test_reconcile_is_stable_when_nothing_changed() -> None:
    workers = pool(8)
    placement = placed(workers)
    before = dict(placement.assignment)
    assert placement.reconcile(workers) == []
    assert placement.reconcile(list(reversed(workers))) == []
    assert placement.assignment == before


@pytest.mark.parametrize("victim", [f"w{i}" for i in range(8)])
def test_dead_worker_moves_exactly_its_partitions(victim: str) -> None:
    workers = pool(8)
    placement = placed(workers)
    before = dict(placement.assignment)
    orphans = placement.partitions_of(victim)
    assert orphans
    survivors = [w for w in workers if w.worker != victim]

    moves = placement.reconcile(survivors)
    assert sorted(m.partition for m in moves) == orphans
    assert all(m.reason == "dead" and m.src == victim for m in moves)
    assert all(m.dst != victim for m in moves)
    for p, worker in before.items():
        if worker != victim:
            assert placement.owner(p) == worker  # nobody else moved
    assert placement.partitions_of(victim) == []
    assert_within_caps(placement, survivors)
    assert placement.reconcile(survivors) == []


def test_two_dead_workers() -> None:
    workers = pool(8)
    placement = placed(workers)
    before = dict(placement.assignment)
    survivors = workers[2:]
    moves = placement.reconcile(survivors)
    dead = {"w0", "w1"}
    assert {m.partition for m in moves} == {p for p, w in before.items() if w in dead}
    assert all(m.reason == "dead" for m in moves)
    assert_within_caps(placement, survivors)


def test_adding_a_worker_moves_few_partitions() -> None:
    workers = pool(8)
    placement = placed(workers)
    before = dict(placement.assignment)
    held_before = counts(placement)
    grown = [*workers, WorkerView("w8", 1)]

    moves = placement.reconcile(grown)
    assert_each_partition_moved_once(moves)
    # The joiner takes (1 - epsilon) x its share, from the fullest workers, and nothing
    # else moves: bounded-load consistent hashing moves about P / W partitions on a join.
    assert len(moves) <= math.ceil(PARTITIONS / len(grown))
    assert len(placement.partitions_of("w8")) >= math.floor(0.75 * PARTITIONS / 9)
    for m in moves:
        assert m.src is not None and m.dst == "w8"
        assert before[m.partition] == m.src
        assert held_before[m.src] >= min(held_before.values())
    assert_within_caps(placement, grown)
    unmoved = {p for p in before if p not in {m.partition for m in moves}}
    assert all(placement.owner(p) == before[p] for p in unmoved)
    assert placement.reconcile(grown) == []


def test_draining_worker_hands_over_its_partitions() -> None:
    workers = pool(8)
    placement = placed(workers)
    before = dict(placement.assignment)
    leaving = placement.partitions_of("w3")
    fleet = [WorkerView(w.worker, w.slots, draining=w.worker == "w3") for w in workers]

    moves = placement.reconcile(fleet)
    assert sorted(m.partition for m in moves) == leaving
    assert all(m.reason == "drain" and m.src == "w3" and m.dst != "w3" for m in moves)
    assert placement.partitions_of("w3") == []
    assert all(placement.owner(p) == w for p, w in before.items() if w != "w3")
    assert_within_caps(placement, [w for w in fleet if not w.draining])
    assert placement.reconcile(fleet) == []


def test_drain_and_death_together() -> None:
    workers = pool(8)
    placement = placed(workers)
    before = dict(placement.assignment)
    fleet = [WorkerView(w.worker, w.slots, draining=w.worker == "w1") for w in workers[1:]]
    moves = placement.reconcile(fleet)
    reasons = {m.partition: m.reason for m in moves}
    assert reasons == {
        p: "dead" if w == "w0" else "drain" for p, w in before.items() if w in {"w0", "w1"}
    }


def test_nowhere_to_go_changes_nothing() -> None:
    workers = pool(4)
    placement = placed(workers)
    before = dict(placement.assignment)
    all_draining = [WorkerView(w.worker, w.slots, draining=True) for w in workers]
    assert placement.reconcile(all_draining) == []
    assert placement.reconcile([]) == []
    assert placement.assignment == before


def test_a_late_joiner_gets_at_least_its_minimum_share() -> None:
    """Seven workers under their caps, then an eighth joins: it must not idle."""
    placement = Placement(64, epsilon=0.25)
    seven = [WorkerView(f"w{i}", 1) for i in range(7)]
    placement.reconcile(seven)
    assert all(len(placement.partitions_of(w.worker)) <= 12 for w in seven)  # ceil(1.25x64/7)
    moves = placement.reconcile([*seven, WorkerView("w7", 1)])
    assert len(placement.partitions_of("w7")) >= 6  # floor(0.75 x 64 / 8)
    assert len(moves) == len(placement.partitions_of("w7"))  # only what it took moved
    assert placement.reconcile([*seven, WorkerView("w7", 1)]) == []  # and then it is stable
