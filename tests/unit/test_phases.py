"""A request's phases (`Route.phases`): the hops of its route regrouped by what it waited
for, the engine's hop split at the first token and by the engine's own queue report."""

from __future__ import annotations

import pytest

from switchyard.messages.inference import PHASES, Route

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0


def approx(expected: object) -> object:
    """Unix seconds near T0 hold about 0.2 us: compare to a microsecond."""
    return pytest.approx(expected, abs=1e-6)


def route(**stamps: float | None) -> Route:
    """A route whose stamps are offsets from T0 (None: the hop did not happen)."""
    at = {k: None if v is None else T0 + v for k, v in stamps.items()}
    return Route(pool="agent", created_at=T0, **at)  # type: ignore[arg-type]


def test_every_phase_of_a_request_through_the_preprocessor() -> None:
    r = route(prepared_at=0.010, admitted_at=0.012, dispatched_at=0.030, started_at=0.032,
              first_token_at=0.150, finished_at=0.300)  # fmt: skip
    phases = r.phases(engine_queue=0.020)
    assert list(phases) == list(PHASES)
    assert phases == approx({
        "preprocess": 0.010, "router_queue": 0.020, "dispatch": 0.002,
        "engine_queue": 0.020, "prefill": 0.098, "decode": 0.150,
    })  # fmt: skip
    assert sum(phases.values()) == approx(r.finished_at - r.created_at)


def test_without_an_engine_report_its_queue_is_part_of_prefill() -> None:
    r = route(prepared_at=0.0, admitted_at=0.001, dispatched_at=0.002, started_at=0.003,
              first_token_at=0.103, finished_at=0.2)  # fmt: skip
    phases = r.phases()
    assert "engine_queue" not in phases
    assert phases["prefill"] == approx(0.100)


def test_an_engine_queue_longer_than_the_wait_for_the_first_token_is_capped() -> None:
    r = route(dispatched_at=0.0, started_at=0.01, first_token_at=0.05, finished_at=0.1)
    phases = r.phases(engine_queue=0.5)
    assert phases["engine_queue"] == approx(0.04) and phases["prefill"] == 0.0


def test_missing_hops_join_the_next_phase() -> None:
    # A worker with static partitions and no router: nothing admitted or dispatched it.
    r = route(prepared_at=0.005, started_at=0.020, first_token_at=0.030, finished_at=0.040)
    phases = r.phases()
    assert set(phases) == {"preprocess", "dispatch", "prefill", "decode"}
    assert phases["dispatch"] == approx(0.015)
    assert sum(phases.values()) == approx(0.040)


def test_a_request_the_engine_never_started_has_no_engine_phases() -> None:
    r = route(prepared_at=0.001, admitted_at=0.002, dispatched_at=0.003, finished_at=0.5)
    assert set(r.phases(engine_queue=0.1)) == {"preprocess", "router_queue"}


def test_no_token_leaves_the_engine_time_to_prefill() -> None:
    r = route(dispatched_at=0.0, started_at=0.01, finished_at=0.08)
    phases = r.phases()
    assert "decode" not in phases and phases["prefill"] == approx(0.07)


def test_a_skewed_publisher_clock_clamps_at_zero_never_below() -> None:
    # The publisher's clock is 2 s ahead of the fleet's: created_at lies in the future.
    r = route(prepared_at=-2.0, admitted_at=-1.99, dispatched_at=-1.98, started_at=-1.97,
              first_token_at=-1.9, finished_at=-1.8)  # fmt: skip
    phases = r.phases()
    assert phases["preprocess"] == 0.0
    assert all(v >= 0 for v in phases.values())
    assert phases["decode"] == approx(0.1)
