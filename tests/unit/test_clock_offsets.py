"""A session's client clock offset: the min filter over its recent steps' samples."""

from __future__ import annotations

import pytest

from services.preprocessor.clock import ClockOffsets
from switchyard.messages.inference import MAX_CLOCK_OFFSET

NOW = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("skew", [-5.0, 0.0, 5.0])
def test_the_estimate_is_the_offset_plus_the_shortest_transit(skew: float) -> None:
    """A client clock `skew` s ahead of the fleet's; transits 80, 20, 150, 30 ms."""
    clock = Clock()
    offsets = ClockOffsets(clock=clock)
    estimates = []
    for i, transit in enumerate((0.080, 0.020, 0.150, 0.030)):
        sent_fleet = NOW + i * 0.5
        clock.now = sent_fleet + transit
        estimates.append(offsets.observe("acme", "ep", sent_fleet + skew, clock.now))
    # Fleet minus client = -skew, plus the least transit seen so far: never less, so a frame
    # is never judged older than it is; 20 ms more at most once that step was seen.
    assert estimates == pytest.approx([-skew + 0.080, -skew + 0.020, -skew + 0.020, -skew + 0.020])


def test_sessions_and_tenants_are_estimated_apart() -> None:
    offsets = ClockOffsets(clock=lambda: NOW)
    assert offsets.observe("acme", "a", NOW - 5, NOW) == pytest.approx(5.0)
    assert offsets.observe("acme", "b", NOW + 3, NOW) == pytest.approx(-3.0)
    assert offsets.observe("other", "a", NOW, NOW) == pytest.approx(0.0)
    assert offsets.observe("acme", "a", NOW - 4.9, NOW) == pytest.approx(4.9)
    # Without a session a step is its own estimate (nothing to remember it by).
    assert offsets.observe("acme", None, NOW - 7, NOW) == pytest.approx(7.0)
    assert len(offsets) == 3


def test_old_samples_leave_the_window_so_a_stepped_clock_is_followed() -> None:
    clock = Clock()
    offsets = ClockOffsets(window=4, horizon=120.0, clock=clock)
    for i in range(4):
        clock.now = NOW + i
        offsets.observe("acme", "ep", clock.now - 0.01, clock.now)  # in sync, 10 ms transit
    # NTP steps the phone's clock back 5 s: the old samples hold the estimate down until
    # they leave the window (4 steps here), then the new offset shows.
    seen = []
    for i in range(4, 9):
        clock.now = NOW + i
        seen.append(offsets.observe("acme", "ep", clock.now - 0.01 - 5.0, clock.now))
    assert seen[:3] == pytest.approx([0.01] * 3)
    assert seen[3:] == pytest.approx([5.01, 5.01])


def test_samples_older_than_the_horizon_are_dropped_and_idle_sessions_forgotten() -> None:
    clock = Clock()
    offsets = ClockOffsets(horizon=60.0, clock=clock)
    offsets.observe("acme", "ep", NOW - 0.01, NOW)
    offsets.observe("acme", "idle", NOW - 2, NOW)
    clock.now = NOW + 61
    # The 10 ms sample is past the horizon: the new one (+1 s of skew) alone counts.
    assert offsets.observe("acme", "ep", clock.now - 1.0, clock.now) == pytest.approx(1.0)
    assert len(offsets) == 1  # "idle" sent nothing within the horizon


def test_at_most_max_sessions_are_kept_and_a_wild_clock_is_clamped() -> None:
    offsets = ClockOffsets(max_sessions=2, clock=lambda: NOW)
    for s in ("a", "b", "c"):
        offsets.observe("acme", s, NOW, NOW)
    assert len(offsets) == 2
    assert offsets.observe("acme", "d", 0.0, NOW) == MAX_CLOCK_OFFSET
    assert offsets.observe("acme", "e", NOW * 2, NOW) == -MAX_CLOCK_OFFSET
