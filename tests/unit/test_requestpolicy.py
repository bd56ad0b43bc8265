"""Whether a request may still run (cancelled, superseded, stale, expired), the cancel
tombstones and the newest step per agent session."""

from __future__ import annotations

import pytest

from switchyard.engines.base import NO_DUE, EngineRequest
from switchyard.messages.inference import ChatMessage, GenerateRequest
from switchyard.requestpolicy import (
    NewestSteps,
    Refusal,
    Tombstones,
    stale_frame,
    staleness,
    verdict,
)

NOW = 1_700_000_000.0


def request(**fields: object) -> GenerateRequest:
    return GenerateRequest.model_validate(
        {
            "tenant": "acme",
            "workload": "agent",
            "created_at": NOW - 10,
            "messages": [ChatMessage(role="user", content="tap")],
            **fields,
        }
    )


def test_a_fresh_request_may_run() -> None:
    assert verdict(request(), NOW, where="at dispatch") is None
    fresh = request(deadline=NOW + 1, frame_ts=NOW - 0.5, stale_after=1.0)
    assert verdict(fresh, NOW, where="at dispatch") is None
    # At the budget or the deadline exactly is not past it.
    edge = request(deadline=NOW, frame_ts=NOW - 1.0, stale_after=1.0)
    assert verdict(edge, NOW, where="at dispatch") is None


def test_a_frame_older_than_its_budget_is_stale() -> None:
    refusal = verdict(request(frame_ts=NOW - 3.5, stale_after=2.0), NOW, where="while queued")
    assert refusal == Refusal("stale", "stale", "frame is 3.500s old while queued, budget 2.000s")
    assert refusal.error.code == "stale" and refusal.error.retry_after is None
    # No budget, or no frame: never stale.
    assert verdict(request(frame_ts=NOW - 3600), NOW, where="x") is None
    assert verdict(request(stale_after=0.1), NOW, where="x") is None


def test_a_step_is_judged_by_the_same_rule_before_it_is_a_request() -> None:
    """The preprocessor's check (`stale_frame`, the age it measured on the fleet's clock)
    says what the request's would, in the same words."""
    refusal = stale_frame(3.5, 2.0, where="at preprocessing")
    assert refusal == Refusal(
        "stale", "stale", "frame is 3.500s old at preprocessing, budget 2.000s"
    )
    assert stale_frame(2.0, 2.0, where="x") is None  # at its budget, not over it
    assert stale_frame(None, 2.0, where="x") is None and stale_frame(9.0, None, where="x") is None
    req = request(frame_ts=NOW - 3.5, stale_after=2.0)
    assert staleness(req, NOW, where="at preprocessing") == refusal


def test_a_request_past_its_deadline_is_expired() -> None:
    refusal = verdict(request(deadline=NOW - 0.25), NOW, where="at dispatch")
    assert refusal is not None
    assert (refusal.status, refusal.code) == ("expired", "expired")
    assert refusal.reason == "deadline passed at dispatch (0.250s late)"


def test_the_clock_offset_moves_the_capture_time_onto_the_fleets_clock() -> None:
    # A phone whose clock is 5 s behind stamps NOW - 5.5 on a frame captured 0.5 s ago.
    behind = request(frame_ts=NOW - 5.5, stale_after=2.0, clock_offset=5.0)
    assert behind.frame_age(NOW) == pytest.approx(0.5)
    assert verdict(behind, NOW, where="x") is None
    assert verdict(behind.model_copy(update={"clock_offset": 0.0}), NOW, where="x") is not None
    # One 5 s ahead stamps NOW + 2 on a frame captured 3 s ago: stale, not "from the future".
    ahead = request(frame_ts=NOW + 2.0, stale_after=2.0, clock_offset=-5.0)
    refusal = staleness(ahead, NOW, where="when its answer was ready")
    assert refusal == Refusal(
        "stale", "stale", "frame is 3.000s old when its answer was ready, budget 2.000s"
    )
    assert verdict(ahead.model_copy(update={"clock_offset": 0.0}), NOW, where="x") is None


def test_a_request_is_due_at_its_deadline_or_when_its_frame_goes_stale() -> None:
    """What the engines schedule by (`EngineRequest.due`, earliest first): whichever of
    the deadline and the frame's staleness (on the fleet's clock) comes first."""
    step = request(deadline=NOW + 5, frame_ts=NOW - 5.5, stale_after=2.0, clock_offset=5.0)
    assert step.due() == pytest.approx(NOW + 1.5)  # stale before the deadline
    assert request(deadline=NOW + 1, frame_ts=NOW, stale_after=2.0).due() == NOW + 1
    assert request(frame_ts=NOW, stale_after=2.0).due() == NOW + 2
    assert request(frame_ts=NOW).due() is None and request().due() is None
    engine = EngineRequest.from_generate(step)
    assert engine.due == step.due() and engine.priority == int((NOW + 1.5) * 1000)
    assert EngineRequest.from_generate(request()).priority == NO_DUE


def test_a_lower_step_of_a_session_than_its_newest_is_superseded() -> None:
    step = request(session="ep1", step=3, frame_ts=NOW, stale_after=2.0)
    refusal = verdict(step, NOW, newest=4, where="while queued")
    assert refusal == Refusal(
        "superseded", "superseded", "step 3 superseded by step 4 of its session while queued"
    )
    assert verdict(step, NOW, newest=3, where="x") is None  # itself is not newer
    assert verdict(step, NOW, newest=None, where="x") is None
    # Not an agent step (chat, SQL): no step number, never superseded.
    assert verdict(request(session="ep1"), NOW, newest=9, where="x") is None


@pytest.mark.parametrize(
    ("cancelled", "newer", "stale", "status"),
    [
        (True, True, True, "cancelled"),
        (False, True, True, "superseded"),
        (False, False, True, "stale"),
    ],
)
def test_a_cancel_comes_before_a_newer_step_which_comes_before_staleness(
    cancelled: bool, newer: bool, stale: bool, status: str
) -> None:
    req = request(session="s", step=1, frame_ts=NOW - (5.0 if stale else 0.0), stale_after=1.0)
    refusal = verdict(req, NOW, cancelled=cancelled, newest=2 if newer else 1, where="x")
    assert refusal is not None and refusal.status == status == refusal.code


@pytest.mark.parametrize(
    ("cancelled", "stale", "expired", "status"),
    [
        (True, True, True, "cancelled"),
        (False, True, True, "stale"),
        (False, False, True, "expired"),
        (True, False, False, "cancelled"),
    ],
)
def test_cancel_comes_first_then_staleness_then_the_deadline(
    cancelled: bool, stale: bool, expired: bool, status: str
) -> None:
    req = request(
        frame_ts=NOW - (5.0 if stale else 0.0), stale_after=1.0,
        deadline=NOW - 1 if expired else NOW + 1,
    )  # fmt: skip
    refusal = verdict(req, NOW, cancelled=cancelled, where="before it started")
    assert refusal is not None and refusal.status == status == refusal.code
    if cancelled:
        assert refusal.reason == "cancelled before it started"


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def test_tombstones_remember_a_cancel_for_their_ttl() -> None:
    clock = Clock()
    tombs = Tombstones(ttl=600.0, clock=clock)
    assert "r1" not in tombs
    tombs.add("r1")
    assert "r1" in tombs and "r2" not in tombs
    clock.now += 600.0
    assert "r1" in tombs  # at the TTL exactly: still remembered
    clock.now += 0.001
    assert "r1" not in tombs  # forgotten even before anything prunes it


def test_tombstones_prune_the_old_on_add_and_a_repeated_cancel_counts_from_now() -> None:
    clock = Clock()
    tombs = Tombstones(ttl=10.0, clock=clock)
    for i in range(5):
        tombs.add(f"r{i}")
        clock.now += 3.0
    tombs.add("r0")  # again, at +15: r0 lives on, r1 (at +3) is past its TTL
    assert len(tombs) == 4 and "r0" in tombs and "r1" not in tombs
    clock.now += 6.0  # +21: r2 (+6), r3 (+9) are past it, r4 (+12) and r0 (+15) are not
    tombs.add("r5")
    assert len(tombs) == 3
    assert [r for r in ("r0", "r1", "r2", "r3", "r4", "r5") if r in tombs] == ["r0", "r4", "r5"]


def test_newest_steps_keep_the_highest_step_per_tenant_and_session() -> None:
    clock = Clock()
    newest = NewestSteps(ttl=60.0, clock=clock)
    one = request(session="ep", step=1)
    assert newest.newest(one) is None
    assert newest.see("acme", "ep", 1) is True
    assert newest.see("acme", "ep", 1) is False  # the same step again: nothing new to tell
    assert newest.see("acme", "ep", 3) is True
    assert newest.see("acme", "ep", 2) is False  # late and lower: the newest stays 3
    assert newest.newest(one) == 3
    # Another tenant's session of the same name is another session.
    assert newest.newest(request(tenant="other", session="ep", step=1)) is None
    assert newest.see_request(request(session="ep")) is False  # no step number: not a step
    assert newest.see_request(request(tenant="other", session="ep", step=0)) is True


def test_newest_steps_forget_a_session_ttl_after_its_step_last_rose() -> None:
    clock = Clock()
    newest = NewestSteps(ttl=60.0, clock=clock)
    newest.see("acme", "a", 5)
    clock.now += 30.0
    newest.see("acme", "b", 1)
    newest.see("acme", "a", 2)  # lower: does not keep "a" alive
    clock.now += 30.001
    # A client that counts from 0 again in the same session is superseded for a TTL at most.
    assert newest.newest(request(session="a", step=0)) is None
    assert newest.newest(request(session="b", step=0)) == 1
    newest.see("acme", "c", 1)  # prunes the expired "a"
    assert len(newest) == 2
