"""The modelled step latency of `sy agent-sim`, its capacity search, and answer mapping."""

from __future__ import annotations

import json
import math

import pytest

from switchyard.agentprompt import Geometry, answer_to_original
from switchyard.bench.agentsim import (
    LoadResult,
    StepRecord,
    explain_limit,
    modelled_latency,
    next_load,
)

pytestmark = pytest.mark.unit


def rec(
    step: int, *, router: float, dispatch: float, queue: float, prefill: float, decode: float,
    wall: float = 1.0, fleet: float = 0.9, status: str = "ok",
) -> StepRecord:  # fmt: skip
    return StepRecord(
        phone=0, step=step, status=status, latency_s=wall, fleet_s=fleet, router_s=router,
        dispatch_s=dispatch, engine_queue_s=queue, prefill_s=prefill, decode_s=decode,
        frame_s=0.002,
    )  # fmt: skip


def test_modelled_latency_divides_measured_parts_by_the_delay_scale() -> None:
    # Scale 10: 0.1 s of wall router wait is 10 ms of modelled time; engine parts are modelled.
    r = rec(0, router=0.1, dispatch=0.05, queue=0.002, prefill=0.06, decode=0.2)
    assert r.modelled(10.0) == pytest.approx(0.01 + 0.005 + 0.002 + 0.06 + 0.2)
    assert r.parts(10.0)["router"] == pytest.approx(0.01)
    assert (
        rec(0, router=0, dispatch=0, queue=0, prefill=0, decode=0, status="stale").modelled(1)
        is None
    )


def test_modelled_summary_percentiles_tail_parts_and_limit() -> None:
    # 99 ordinary steps (decode-bound) and one slow one whose lateness is queueing.
    recs = [rec(k, router=0, dispatch=0, queue=0, prefill=0.05, decode=0.2) for k in range(99)]
    recs.append(rec(99, router=0, dispatch=0, queue=0.4, prefill=0.05, decode=0.2))
    m = modelled_latency(recs, scale=1.0, loop_s=100 * 0.5)
    assert m is not None
    assert m.p50_ms == 250.0
    assert m.p99_ms == 250.0  # nearest rank: the 99th of 100 values
    assert m.p50_parts_ms == {"router": 0.0, "dispatch": 0.0, "engine_queue": 0.0,
                              "prefill": 50.0, "decode": 200.0}  # fmt: skip
    assert m.limit == "decode"
    # Modelled 25.4 s over 50 s of phone loops: half the loop was spent outside the model.
    assert m.loop_efficiency == pytest.approx(25.4 / 50, abs=1e-3)
    assert m.outside_p50_ms == 100.0  # wall 1.0 - admission->answer 0.9
    assert m.harness_frame_p50_ms == 2.0

    # With two slow steps the p99 is a queued one, and the tail says so.
    recs.append(rec(100, router=0, dispatch=0, queue=0.4, prefill=0.05, decode=0.2))
    m = modelled_latency(recs, scale=1.0, loop_s=50.0)
    assert m is not None and m.p99_ms == 650.0
    assert m.tail_parts_ms["engine_queue"] == 400.0
    assert m.limit == "queueing"


def test_a_step_not_answered_ok_makes_p99_infinite() -> None:
    recs = [rec(k, router=0, dispatch=0, queue=0, prefill=0.05, decode=0.2) for k in range(10)]
    recs.append(rec(10, router=0, dispatch=0, queue=0, prefill=0, decode=0, status="stale"))
    m = modelled_latency(recs, scale=1.0, loop_s=10.0)
    assert m is not None and math.isinf(m.p99_ms) and m.p50_ms == 250.0
    assert modelled_latency([recs[-1]], scale=1.0, loop_s=1.0) is None


def search(capacity: int, ladder: list[int], resolution: int) -> list[int]:
    """The loads `next_load` tries against a fleet that serves exactly `capacity` phones."""
    results: dict[int, bool] = {}
    tried: list[int] = []
    while (n := next_load(results, ladder, resolution)) is not None:
        tried.append(n)
        results[n] = n <= capacity
    return tried


def test_search_climbs_the_ladder_then_bisects() -> None:
    ladder = [50, 100, 200, 400, 600, 800]
    tried = search(333, ladder, resolution=25)
    assert tried[:4] == [50, 100, 200, 400]  # climbs until 400 fails
    assert tried[4:] == [300, 350, 325]  # bisects 200..400 until pass and fail are 25 apart
    assert max(n for n in tried if n <= 333) == 325


def test_search_ends_at_the_top_rung_or_below_the_first() -> None:
    ladder = [50, 100, 200]
    assert search(10_000, ladder, resolution=10) == [50, 100, 200]
    assert search(20, ladder, resolution=10) == [50]  # capacity below the first rung
    assert search(60, ladder, resolution=10) == [50, 100, 75, 62, 56]


def test_answers_map_to_original_pixels_in_both_shapes() -> None:
    g = Geometry(orig_width=1280, orig_height=720, width=308, height=168)
    bare = answer_to_original('{"type":"click","x":154,"y":84}', g)
    assert json.loads(bare) == {"type": "click", "x": 642, "y": 362}
    chunk = answer_to_original(
        '{"thought":"close it","actions":[{"type":"swipe","x1":0,"y1":0,"x2":307,"y2":167,'
        '"ms":300},{"type":"back"},{"type":"long_press","x":9999,"y":5,"ms":800}]}',
        g,
    )
    out = json.loads(chunk)
    assert out["thought"] == "close it"
    assert out["actions"][0] == {"type": "swipe", "x1": 2, "y1": 2, "x2": 1277, "y2": 717,
                                 "ms": 300}  # fmt: skip
    assert out["actions"][1] == {"type": "back"}
    assert out["actions"][2]["x"] == 1279  # off-screen model output lands on the edge
    assert answer_to_original('{"type":"click","x":', g) == '{"type":"click","x":'  # untouched
    same = Geometry(orig_width=308, orig_height=168, width=308, height=168)
    assert json.loads(answer_to_original('{"type":"click","x":10,"y":20}', same))["x"] == 10


def load(phones: int, dispatch: float, passed: bool) -> LoadResult:
    recs = [rec(k, router=0, dispatch=dispatch if k >= 98 else 0.0, queue=0, prefill=0.25,
                decode=0.22) for k in range(100)]  # fmt: skip
    m = modelled_latency(recs, scale=1.0, loop_s=100.0)
    assert m is not None
    return LoadResult(phones, 100, 100, 0, {}, 0, 0.0, 0.0, m, passed, "")


def test_the_limit_names_the_largest_part_and_what_grew() -> None:
    at, fail = load(137, 0.0, True), load(150, 0.23, False)
    text = explain_limit(at, fail)
    assert text.startswith("prefill (beyond capacity, 150 phones")
    assert "grew most in dispatch (+230.0 ms)" in text
    assert explain_limit(at, None).startswith("prefill (at the largest load tried, 137 phones")
