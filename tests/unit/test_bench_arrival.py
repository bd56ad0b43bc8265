"""Arrival schedules (seeded, at their rates) and the load test's request generators."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter

import pytest

from switchyard.bench.arrival import Arrival, ArrivalError, schedule
from switchyard.bench.workloads import AgentShape, ChatShape, Workload, WorkloadError


def per_second(times: list[float], duration: int) -> list[int]:
    counts = Counter(int(t) for t in times)
    return [counts.get(s, 0) for s in range(duration)]


@pytest.mark.parametrize("kind", ["poisson", "constant", "bursty"])
def test_same_seed_same_schedule(kind: str) -> None:
    a = Arrival(kind, rate=7.5)  # type: ignore[arg-type]
    assert schedule(a, 30, seed=3) == schedule(a, 30, seed=3)
    times = schedule(a, 30, seed=3)
    assert times == sorted(times) and all(0 <= t < 30 for t in times)


def test_different_seeds_differ() -> None:
    a = Arrival("poisson", rate=5)
    assert schedule(a, 30, seed=1) != schedule(a, 30, seed=2)


def test_poisson_rate_and_exponential_gaps() -> None:
    rate, duration = 20.0, 500
    times = schedule(Arrival("poisson", rate=rate), duration, seed=11)
    # 10,000 expected; the count of a Poisson process has sd 100: 4 sd either way.
    assert abs(len(times) - rate * duration) < 400
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.05)
    # Exponential gaps: sd equals the mean (coefficient of variation 1).
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.05)


def test_constant_is_evenly_spaced() -> None:
    times = schedule(Arrival("constant", rate=4), 10, seed=0)
    assert len(times) == 40
    assert times[:3] == [0.0, 0.25, 0.5]
    assert {round(b - a, 9) for a, b in itertools.pairwise(times)} == {0.25}


def test_bursty_keeps_the_mean_rate_with_more_variance() -> None:
    rate, duration = 16.0, 400
    bursty = schedule(Arrival("bursty", rate=rate, burst=8), duration, seed=5)
    poisson = schedule(Arrival("poisson", rate=rate), duration, seed=5)
    assert len(bursty) == pytest.approx(rate * duration, rel=0.1)

    # Index of dispersion of per-second counts: ~1 for Poisson, ~burst size for bursts of 8.
    def dispersion(ts: list[float]) -> float:
        c = per_second(ts, duration)
        return statistics.pvariance(c) / statistics.fmean(c)

    assert dispersion(poisson) == pytest.approx(1.0, abs=0.3)
    assert dispersion(bursty) > 4.0
    # Requests of one burst arrive together.
    assert bursty[1] - bursty[0] == pytest.approx(0.001)


def test_closed_loop_has_no_schedule_and_bad_arrivals_are_refused() -> None:
    with pytest.raises(ArrivalError, match="closed loop"):
        schedule(Arrival("closed", concurrency=4), 10, seed=0)
    for bad in ({"kind": "poisson", "rate": 0}, {"kind": "poisson", "rate": float("inf")},
                {"kind": "closed", "concurrency": 0}, {"kind": "zipf"},
                {"kind": "bursty", "burst": 0}):  # fmt: skip
        with pytest.raises(ArrivalError):
            Arrival(**bad)  # type: ignore[arg-type]
    with pytest.raises(ArrivalError):
        schedule(Arrival("poisson", rate=1), 0, seed=0)


def _fields(w: Workload, n: int) -> list[tuple[object, ...]]:
    return [(s.kind, s.messages, s.max_tokens, s.session, s.step, s.frames, s.question)
            for s in w.take(n)]  # fmt: skip


@pytest.mark.parametrize("name", ["chat", "agent", "sql", "mixed"])
def test_workloads_are_reproducible(name: str) -> None:
    shape = AgentShape(sessions=3, steps=4, frame_size=(160, 90), frame_pool=2)

    def make(seed: int) -> Workload:
        return Workload(name, seed=seed, agent=shape, run="r")  # type: ignore[arg-type]

    assert _fields(make(9), 40) == _fields(make(9), 40)
    assert _fields(make(9), 40) != _fields(make(10), 40)


def test_chat_lengths_follow_the_shape() -> None:
    w = Workload("chat", seed=1, chat=ChatShape(input_median=100, output_median=40,
                                                input_sigma=0.5, output_sigma=0.5))  # fmt: skip
    specs = w.take(2000)
    outs = [s.max_tokens for s in specs]
    words = [len(s.messages[1][1].split()) - 5 for s in specs]  # minus the fixed lead-in
    assert statistics.median(outs) == pytest.approx(40, rel=0.1)
    assert statistics.median(words) == pytest.approx(100, rel=0.1)
    assert max(outs) > 2 * 40  # a right tail, as real traffic has
    assert all(s.messages[0] == specs[0].messages[0] for s in specs)  # one shared system prompt


def test_agent_episodes_step_in_order_with_their_previous_frame() -> None:
    w = Workload("agent", seed=2, agent=AgentShape(sessions=2, steps=3, frame_size=(160, 90),
                                                   frame_pool=3))  # fmt: skip
    specs = w.take(30)
    by_session: dict[str, list[int]] = {}
    for s in specs:
        by_session.setdefault(s.session, []).append(s.step)
        assert len(s.frames) == (1 if s.step == 0 else 2)
        assert len(s.history) == s.step
    for steps in by_session.values():
        assert steps == list(range(len(steps))) and len(steps) <= 3
    assert len(by_session) > 2  # finished episodes were replaced by new ones
    # An episode's step k shows as the previous frame of step k+1.
    first = [s for s in specs if s.session == specs[0].session]
    assert first[1].frames[0] == first[0].frames[-1]


def test_mixed_follows_its_weights() -> None:
    w = Workload("mixed", seed=4, weights={"chat": 0.5, "sql": 0.5, "agent": 0.0},
                 agent=AgentShape(frame_size=(160, 90)))  # fmt: skip
    kinds = Counter(s.kind for s in w.take(2000))
    assert kinds["agent"] == 0
    assert kinds["chat"] == pytest.approx(1000, abs=150)


def test_bad_workloads_are_refused() -> None:
    with pytest.raises(WorkloadError):
        Workload("video")  # type: ignore[arg-type]
    with pytest.raises(WorkloadError):
        Workload("mixed", weights={"chat": -1.0})
    with pytest.raises(WorkloadError):
        Workload("mixed", weights={"chat": 0.0, "sql": 0.0})
    with pytest.raises(WorkloadError):
        ChatShape(input_median=0)
