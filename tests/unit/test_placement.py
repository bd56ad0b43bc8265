"""Placement: bounded-load consistent hashing of partitions onto workers, and its moves."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from switchyard.scheduling.placement import Move, Placement, WorkerView

PARTITIONS = 64
COOLDOWN = 60.0
LATER = 10_000.0  # well past any cooldown started at t = 0


def pool(n: int, slots: int = 1, prefix: str = "w") -> list[WorkerView]:
    return [WorkerView(f"{prefix}{i}", slots) for i in range(n)]


def counts(placement: Placement) -> Counter[str]:
    return Counter(placement.assignment.values())


def caps(workers: list[WorkerView], epsilon: float, partitions: int = PARTITIONS) -> dict[str, int]:
    total = sum(w.slots for w in workers)
    return {w.worker: math.ceil((1 + epsilon) * partitions * w.slots / total) for w in workers}


def placed(workers: list[WorkerView], epsilon: float = 0.25) -> Placement:
    placement = Placement(PARTITIONS, epsilon=epsilon, spill_cooldown=COOLDOWN)
    placement.reconcile(workers, None, 0.0)
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
    moves = placement.reconcile(workers, None, 0.0)
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
    assert placement.reconcile(workers, None, 1.0) == []
    assert placement.reconcile(list(reversed(workers)), None, 2.0) == []
    # Even load: every worker is within (1 + epsilon) x the mean, so no spill either.
    even = {p: 1.0 for p in range(PARTITIONS)}
    assert placement.reconcile(workers, even, LATER) == []
    assert placement.assignment == before


@pytest.mark.parametrize("victim", [f"w{i}" for i in range(8)])
def test_dead_worker_moves_exactly_its_partitions(victim: str) -> None:
    workers = pool(8)
    placement = placed(workers)
    before = dict(placement.assignment)
    orphans = placement.partitions_of(victim)
    assert orphans
    survivors = [w for w in workers if w.worker != victim]

    moves = placement.reconcile(survivors, None, 100.0)
    assert sorted(m.partition for m in moves) == orphans
    assert all(m.reason == "dead" and m.src == victim for m in moves)
    assert all(m.dst != victim for m in moves)
    for p, worker in before.items():
        if worker != victim:
            assert placement.owner(p) == worker  # nobody else moved
    assert placement.partitions_of(victim) == []
    assert_within_caps(placement, survivors)
    assert placement.reconcile(survivors, None, 101.0) == []


def test_two_dead_workers() -> None:
    workers = pool(8)
    placement = placed(workers)
    before = dict(placement.assignment)
    survivors = workers[2:]
    moves = placement.reconcile(survivors, None, 100.0)
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

    moves = placement.reconcile(grown, None, 100.0)
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
    assert placement.reconcile(grown, None, 101.0) == []


def test_adding_a_worker_then_spilling_by_load_converges_with_few_moves() -> None:
    workers = pool(8)
    placement = placed(workers)
    grown = [*workers, WorkerView("w8", 1)]
    placement.reconcile(grown, None, 0.0)
    even = {p: 1.0 for p in range(PARTITIONS)}
    moves: list[Move] = []
    for step in range(30):
        moves += placement.reconcile(grown, even, LATER + step * COOLDOWN)
    assert_each_partition_moved_once(moves)
    assert len(moves) <= math.ceil(PARTITIONS / len(grown))
    bound = (1 + placement.epsilon) * PARTITIONS / len(grown)
    assert max(counts(placement).values()) <= bound
    assert placement.reconcile(grown, even, LATER + 31 * COOLDOWN) == []


def test_draining_worker_hands_over_its_partitions() -> None:
    workers = pool(8)
    placement = placed(workers)
    before = dict(placement.assignment)
    leaving = placement.partitions_of("w3")
    fleet = [WorkerView(w.worker, w.slots, draining=w.worker == "w3") for w in workers]

    moves = placement.reconcile(fleet, None, 100.0)
    assert sorted(m.partition for m in moves) == leaving
    assert all(m.reason == "drain" and m.src == "w3" and m.dst != "w3" for m in moves)
    assert placement.partitions_of("w3") == []
    assert all(placement.owner(p) == w for p, w in before.items() if w != "w3")
    assert_within_caps(placement, [w for w in fleet if not w.draining])
    assert placement.reconcile(fleet, None, 101.0) == []


def test_drain_and_death_together() -> None:
    workers = pool(8)
    placement = placed(workers)
    before = dict(placement.assignment)
    fleet = [WorkerView(w.worker, w.slots, draining=w.worker == "w1") for w in workers[1:]]
    moves = placement.reconcile(fleet, None, 100.0)
    reasons = {m.partition: m.reason for m in moves}
    assert reasons == {
        p: "dead" if w == "w0" else "drain" for p, w in before.items() if w in {"w0", "w1"}
    }


def test_nowhere_to_go_changes_nothing() -> None:
    workers = pool(4)
    placement = placed(workers)
    before = dict(placement.assignment)
    all_draining = [WorkerView(w.worker, w.slots, draining=True) for w in workers]
    assert placement.reconcile(all_draining, None, 100.0) == []
    assert placement.reconcile([], None, 100.0) == []
    assert placement.assignment == before


# --- load-based spill ----------------------------------------------------------------


def spill_setup(
    layout: dict[str, list[int]], slots: dict[str, int] | None = None
) -> tuple[Placement, list[WorkerView]]:
    """A placement with a given assignment; nothing has moved recently."""
    assignment = {p: worker for worker, parts in layout.items() for p in parts}
    placement = Placement(
        partitions=len(assignment),
        epsilon=0.25,
        spill_cooldown=COOLDOWN,
        assignment=assignment,
    )
    workers = [WorkerView(w, (slots or {}).get(w, 1)) for w in layout]
    assert_within_caps(placement, workers)  # so only the spill logic can move anything
    return placement, workers


FOUR = {"w0": [0, 1], "w1": [2, 3], "w2": [4, 5], "w3": [6, 7]}


def test_spill_only_when_a_worker_exceeds_the_bound() -> None:
    placement, workers = spill_setup(FOUR)
    # Per worker: 5, 3, 3, 5. Mean 4, bound 1.25 x 4 = 5: at the bound is not over it.
    load = {0: 3.0, 1: 2.0, 2: 1.5, 3: 1.5, 4: 1.5, 5: 1.5, 6: 2.5, 7: 2.5}
    assert placement.reconcile(workers, load, LATER) == []

    load[0] = 3.25  # w0 now 5.25 > 1.25 x 4.0625
    moves = placement.reconcile(workers, load, LATER)
    assert len(moves) == 1
    (move,) = moves
    assert (move.src, move.reason) == ("w0", "spill")
    assert move.dst in {"w1", "w2"}  # the coolest
    # Partition 0 (3.25) would push the target to 6.25, over the bound; 1 (2.0) fits.
    assert move.partition == 1
    assert placement.owner(1) == move.dst


def test_spill_moves_at_most_one_partition_per_call() -> None:
    placement, workers = spill_setup(FOUR)
    # 8, 8, 1, 1: two workers over the bound (5.625), each with a partition that fits.
    load = {0: 4.0, 1: 4.0, 2: 4.0, 3: 4.0, 4: 0.5, 5: 0.5, 6: 0.5, 7: 0.5}
    first = placement.reconcile(workers, load, LATER)
    assert len(first) == 1
    second = placement.reconcile(workers, load, LATER)
    assert len(second) == 1
    assert {first[0].src, second[0].src} == {"w0", "w1"}
    assert {first[0].dst, second[0].dst} == {"w2", "w3"}
    assert placement.reconcile(workers, load, LATER) == []  # 4, 4, 5, 5: balanced


def test_spill_respects_the_cooldown() -> None:
    layout = {"w0": [0, 1, 2], "w1": [3, 4], "w2": [5, 6], "w3": [7]}
    placement, workers = spill_setup(layout)
    # 2.8, 0.5, 0.75, 1.0: w0 is over the bound; partition 0 evens it out best.
    load = {0: 1.0, 1: 0.9, 2: 0.9, 3: 0.25, 4: 0.25, 5: 0.25, 6: 0.5, 7: 1.0}
    assert placement.reconcile(workers, load, 1_000.0) == [Move(0, "w0", "w1", "spill")]
    # Now w1 is the hot one (0 + 3 = 3.0, mean 1, bound 1.25). Partition 3 fits nowhere;
    # partition 0 would fit on w3 but has just moved.
    load = {0: 1.0, 1: 0.25, 2: 0.25, 3: 2.0, 4: 0.0, 5: 0.25, 6: 0.25, 7: 0.0}
    assert placement.reconcile(workers, load, 1_000.0 + COOLDOWN - 0.001) == []
    later = placement.reconcile(workers, load, 1_000.0 + COOLDOWN)
    assert later == [Move(0, "w1", "w3", "spill")]


def test_partitions_moved_for_a_dead_worker_are_in_cooldown() -> None:
    workers = pool(4)
    placement = Placement(16, epsilon=0.25, spill_cooldown=COOLDOWN)
    placement.reconcile(workers, None, -LATER)  # long ago
    orphans = placement.partitions_of("w0")
    survivors = workers[1:]
    assert {m.partition for m in placement.reconcile(survivors, None, 1_000.0)} == set(orphans)
    received = {w.worker: [p for p in orphans if placement.owner(p) == w.worker] for w in survivors}
    hot = max(received, key=lambda w: len(received[w]))
    assert len(received[hot]) >= 2
    other = next(w for w in received if w != hot)
    # hot carries 2 (two partitions that just moved), other 0.5, the third 0:
    # mean 0.83, bound 1.04, so one of hot's partitions would fit on the third.
    load = {p: 0.0 for p in range(16)}
    load[received[hot][0]] = load[received[hot][1]] = 1.0
    load[placement.partitions_of(other)[0]] = 0.5

    fresh = Placement(
        16, epsilon=0.25, spill_cooldown=COOLDOWN, assignment=dict(placement.assignment)
    )
    assert len(fresh.reconcile(survivors, load, 1_001.0)) == 1  # without the history
    assert placement.reconcile(survivors, load, 1_001.0) == []
    (move,) = placement.reconcile(survivors, load, 1_000.0 + COOLDOWN)
    assert move.src == hot
    assert move.partition in received[hot][:2]


def test_spill_never_overloads_the_target() -> None:
    placement, workers = spill_setup(FOUR)
    # w0 is far over the bound, but its only loaded partition would overload anyone.
    load = {0: 6.0, 1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0, 5: 0.0, 6: 1.0, 7: 0.0}
    assert placement.reconcile(workers, load, LATER) == []
    assert placement.owner(0) == "w0"


def test_spill_picks_a_partition_that_fits_when_the_best_one_does_not() -> None:
    placement, workers = spill_setup({"w0": [0, 1, 2], "w1": [3], "w2": [4, 5]})
    # 24, 6, 6: mean 12, bound 15. Moving 12 evens best but would make the target 18.
    load = {0: 12.0, 1: 6.0, 2: 6.0, 3: 6.0, 4: 6.0, 5: 0.0}
    moves = placement.reconcile(workers, load, LATER)
    assert len(moves) == 1
    (move,) = moves
    assert move.src == "w0"
    assert move.partition in {1, 2}
    assert move.dst in {"w1", "w2"}


def test_spill_weighs_load_by_slots() -> None:
    """Mean load is per slot of the pool: 3 on a 1-slot worker next to a 7-slot worker
    carrying 13 is 1.5 x the pool's 2 per slot, so it spills."""
    layout = {"small": [0, 1], "big": list(range(2, 16))}
    placement, workers = spill_setup(layout, slots={"small": 1, "big": 7})
    load = {p: 1.0 for p in range(16)}
    load[0], load[15] = 2.0, 0.0
    moves = placement.reconcile(workers, load, LATER)
    assert moves == [Move(1, "small", "big", "spill")]


def test_spill_moves_from_a_big_worker_only_past_its_slot_share() -> None:
    layout = {"small": [0], "big": [1, 2, 3, 4]}
    placement, workers = spill_setup(layout, slots={"small": 1, "big": 4})
    # 1 per slot everywhere: balanced although big carries four times as much.
    load = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}
    assert placement.reconcile(workers, load, LATER) == []


def test_spill_without_load_or_with_one_worker_does_nothing() -> None:
    placement, workers = spill_setup(FOUR)
    assert placement.reconcile(workers, {}, LATER) == []
    assert placement.reconcile(workers, {p: 0.0 for p in range(8)}, LATER) == []
    solo = Placement(4, spill_cooldown=COOLDOWN)
    solo.reconcile([WorkerView("only", 1)], None, 0.0)
    assert solo.reconcile([WorkerView("only", 1)], {0: 100.0}, LATER) == []


def test_spill_epsilon_bounds_the_spill_apart_from_the_partition_caps() -> None:
    """Per worker 5.5, 3, 3, 3 (mean 3.625): over 1.25 x the mean, within 2 x."""
    load = {0: 4.0, 1: 1.5, 2: 1.5, 3: 1.5, 4: 1.5, 5: 1.5, 6: 1.5, 7: 1.5}
    placement, workers = spill_setup(FOUR)
    assert [(m.partition, m.src) for m in placement.reconcile(workers, load, LATER)] == [(1, "w0")]

    placement, workers = spill_setup(FOUR)
    placement.spill_epsilon = 1.0
    assert placement.reconcile(workers, load, LATER) == []
    load[0] = 8.0  # w0 now 9.5 > 2 x 4.625
    assert [(m.partition, m.src) for m in placement.reconcile(workers, load, LATER)] == [(1, "w0")]

    # The partition caps keep `epsilon`: a dead worker's partitions go where they did.
    wide = Placement(PARTITIONS, epsilon=0.25, spill_cooldown=COOLDOWN, spill_epsilon=1.0)
    wide.reconcile(pool(4), None, 0.0)
    assert wide.assignment == placed(pool(4)).assignment
    assert_within_caps(wide, pool(4))


def per_slot(
    placement: Placement, load: dict[int, float], slots: dict[str, int], worker: str
) -> float:
    return sum(load[p] for p in placement.partitions_of(worker)) / slots[worker]


def test_spill_invariants_on_random_fleets() -> None:
    rng = random.Random(20_240_611)
    spills = 0
    for _ in range(50):
        n = rng.randint(2, 6)
        workers = [WorkerView(f"w{i}", rng.choice([1, 1, 2, 4])) for i in range(n)]
        placement = Placement(32, epsilon=rng.choice([0.1, 0.25, 0.5]), spill_cooldown=COOLDOWN)
        placement.reconcile(workers, None, 0.0)
        load = {p: rng.choice([0.0, 0.5, 1.0, 2.0, 8.0]) for p in range(32)}
        slots = {w.worker: w.slots for w in workers}

        mean = sum(load.values()) / sum(slots.values())
        bound = (1 + placement.epsilon) * mean
        before = {w: per_slot(placement, load, slots, w) for w in slots}
        moves = placement.reconcile(workers, load, LATER)
        assert len(moves) <= 1
        if not moves:
            continue
        spills += 1
        (move,) = moves
        assert move.reason == "spill"
        assert move.src is not None
        assert before[move.src] > bound  # only off a worker over the bound
        assert before[move.src] == max(before.values())
        assert (
            per_slot(placement, load, slots, move.dst) <= bound + 1e-9
        )  # never onto one that is then over
        assert per_slot(placement, load, slots, move.src) < before[move.src]
    assert spills > 25  # the random fleets did exercise spills


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
