"""A request's GPU-seconds: its share of the engine's time (services/worker/enginetime.py)."""

from __future__ import annotations

import pytest

from services.worker.enginetime import EngineTime

pytestmark = pytest.mark.unit


def test_alone_a_request_is_charged_its_whole_time_split_at_its_first_token() -> None:
    clock = EngineTime()
    start = clock.start(100.0)
    first = clock.mark(100.5)
    end = clock.finish(102.0)
    assert (first - start, end - first) == (0.5, 1.5)


def test_batched_requests_share_the_time_and_the_shares_add_up_to_the_busy_time() -> None:
    clock = EngineTime()
    a = clock.start(0.0)  # alone for 1 s
    b = clock.start(1.0)  # then four together for 2 s
    c = clock.start(1.0)
    d = clock.start(1.0)
    a_end = clock.finish(3.0)
    b_end, c_end = clock.finish(3.0), clock.finish(3.0)
    d_end = clock.finish(4.0)  # then alone for 1 s more
    shares = [a_end - a, b_end - b, c_end - c, d_end - d]
    assert shares == [1.5, 0.5, 0.5, 1.5]
    assert sum(shares) == 4.0  # the engine was busy from 0 to 4: nothing billed twice


def test_idle_time_is_nobody_s_and_a_clock_going_back_charges_nothing() -> None:
    clock = EngineTime()
    a = clock.start(0.0)
    a_end = clock.finish(1.0)
    b = clock.start(50.0)  # 49 s idle in between
    assert clock.mark(49.0) == b  # an earlier stamp adds nothing
    assert clock.finish(51.0) - b == 1.0 and a_end - a == 1.0
