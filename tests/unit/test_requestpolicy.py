"""Whether a request may still run (cancelled, stale, expired), and the cancel tombstones."""

from __future__ import annotations

import pytest

from switchyard.messages.inference import ChatMessage, GenerateRequest
from switchyard.requestpolicy import Refusal, Tombstones, verdict

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


def test_a_request_past_its_deadline_is_expired() -> None:
    refusal = verdict(request(deadline=NOW - 0.25), NOW, where="at dispatch")
    assert refusal is not None
    assert (refusal.status, refusal.code) == ("expired", "expired")
    assert refusal.reason == "deadline passed at dispatch (0.250s late)"


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
