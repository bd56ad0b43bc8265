"""The router's view of live workers: a heartbeat, or a result, within `dead_after`."""

from __future__ import annotations

from typing import Any, cast

from services.router.fleet import Fleet
from switchyard.messages.fleet import WorkerHeartbeat


def beat(worker: str, at: float) -> WorkerHeartbeat:
    return WorkerHeartbeat(worker=worker, pool="agent", engine="sim", at=at, slots=4)


def test_a_worker_whose_heartbeat_is_late_but_that_answers_stays_live() -> None:
    fleet = Fleet(cast("Any", None), dead_after=6.0)  # live() reads no KV
    fleet.workers = {"w0": beat("w0", 100.0), "w1": beat("w1", 100.0)}
    assert [hb.worker for hb in fleet.live("agent", now=105.0)] == ["w0", "w1"]
    # 7 s since either beat: w1 is dead, w0 answered a step 2 s ago and is not.
    fleet.heard_from("w0", 105.0)
    assert [hb.worker for hb in fleet.live("agent", now=107.0)] == ["w0"]
    assert fleet.live("agent", now=111.5) == []  # silent on both counts for 6 s: dead
    assert fleet.live("other", now=105.0) == []
