"""The modelled step latency of `sy agent-sim`, the phones' time, its capacity search, and
answer mapping."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from switchyard.bench.agentsearch import (
    LoadResult,
    best_setting,
    explain_limit,
    judge,
    limit_of,
    next_load,
    role_splits,
)
from switchyard.bench.agentsim import (
    AgentSimConfig,
    AgentSimConfigError,
    PhoneTime,
    StepRecord,
    history_entry,
    ideal_wait,
    modelled_latency,
    summarise,
)
from switchyard.messages.agent import Action, Click, Swipe, TypeText

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
    m = modelled_latency(recs, scale=1.0, loop_s=100 * 0.5, ideal_s=25.4)
    assert m is not None
    assert m.p50_ms == 250.0
    assert m.p99_ms == 250.0  # nearest rank: the 99th of 100 values
    assert m.p50_parts_ms == {"router": 0.0, "dispatch": 0.0, "engine_queue": 0.0,
                              "prefill": 50.0, "decode": 200.0}  # fmt: skip
    assert m.limit == "decode"
    # 25.4 s of ideal phone time over 50 s of phone loops: half was spent outside the model.
    assert m.loop_efficiency == pytest.approx(25.4 / 50, abs=1e-3)
    assert m.outside_p50_ms == 100.0  # wall 1.0 - admission->answer 0.9
    assert m.harness_frame_p50_ms == 2.0

    # With two slow steps the p99 is a queued one, and the tail says so.
    recs.append(rec(100, router=0, dispatch=0, queue=0.4, prefill=0.05, decode=0.2))
    m = modelled_latency(recs, scale=1.0, loop_s=50.0, ideal_s=50.0)
    assert m is not None and m.p99_ms == 650.0
    assert m.tail_parts_ms["engine_queue"] == 400.0
    assert m.limit == "queueing"


def test_a_step_not_answered_ok_makes_p99_infinite() -> None:
    recs = [rec(k, router=0, dispatch=0, queue=0, prefill=0.05, decode=0.2) for k in range(10)]
    recs.append(rec(10, router=0, dispatch=0, queue=0, prefill=0, decode=0, status="stale"))
    m = modelled_latency(recs, scale=1.0, loop_s=10.0, ideal_s=10.0)
    assert m is not None and math.isinf(m.p99_ms) and m.p50_ms == 250.0
    assert modelled_latency([recs[-1]], scale=1.0, loop_s=1.0, ideal_s=1.0) is None


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


def load(phones: int, dispatch: float, passed: bool) -> LoadResult:
    recs = [rec(k, router=0, dispatch=dispatch if k >= 98 else 0.0, queue=0, prefill=0.25,
                decode=0.22) for k in range(100)]  # fmt: skip
    m = modelled_latency(recs, scale=1.0, loop_s=100.0, ideal_s=100.0)
    assert m is not None
    return LoadResult(phones, 100, 100, 0, {}, 0, 0.0, 0.0, m, passed, "")


def test_the_limit_names_the_largest_part_and_what_grew() -> None:
    at, fail = load(137, 0.0, True), load(150, 0.23, False)
    text = explain_limit(at, fail)
    assert text.startswith("prefill (beyond capacity, 150 phones")
    assert "grew most in dispatch (+230.0 ms)" in text
    assert explain_limit(at, None).startswith("prefill (at the largest load tried, 137 phones")
    assert limit_of(at, fail) == "prefill"  # the GPUs' prefill share is unknown here
    fail.prefill_busy, fail.steps_per_s = 0.7, 48.0
    assert limit_of(at, fail) == "prefill saturation"
    assert "48.0 steps/s, prefill kept each GPU 70 % busy" in explain_limit(at, fail)
    assert limit_of(at, None) == "ladder"  # every load passed: the ladder ended it


def test_a_wait_is_the_fleets_until_the_model_had_the_answer() -> None:
    # Sent at 10.0, modelled 0.3 s at 4 wall s per modelled s: ready at 11.2.
    assert ideal_wait(10.5, 11.5, sent=10.0, modelled_s=0.3, k=4.0) == pytest.approx(0.7)
    # The answer came sooner than the model says (a harness cannot be early): all of it.
    assert ideal_wait(10.5, 11.0, sent=10.0, modelled_s=0.3, k=4.0) == pytest.approx(0.5)
    # Ready before the wait began (the phone was executing): none of the wait was needed.
    assert ideal_wait(12.0, 12.4, sent=10.0, modelled_s=0.3, k=4.0) == 0.0
    # No model (a stale answer, another engine): the harness is not blamed.
    assert ideal_wait(10.5, 11.5, sent=10.0, modelled_s=None, k=4.0) == pytest.approx(1.0)


def test_the_phones_time_gives_loop_efficiency_wait_share_and_action_rate() -> None:
    cfg = AgentSimConfig(engine="sim", phones=2, steps=2, delay_scale=2.0, chunk=2, act_ms=500)
    recs = [rec(k, router=0, dispatch=0, queue=0, prefill=0.1, decode=0.15) for k in range(4)]
    for r in recs:
        r.valid, r.executed = True, True
    # Phone 0 answered by w0 (and once by w1), phone 1 by w0: two phones on one worker.
    recs[3].phone = 1
    recs[0].worker = recs[1].worker = recs[3].worker = "w0"
    recs[2].worker = "w1"
    # Each phone: 2 chunks of 2 actions of 1 wall s each (0.5 s x scale 2), two waits of
    # 0.6 wall s of which the model accounts for 0.5 (0.25 modelled s x 2): 5.2 s run.
    times = [PhoneTime(start=0.0, end=5.2, acting=4.0, waiting=1.2, waiting_ideal=1.0,
                       actions=4) for _ in range(2)]  # fmt: skip
    report = summarise(cfg, recs, wall=5.2, times=times)
    assert report.modelled is not None
    assert report.modelled.loop_efficiency == pytest.approx(5.0 / 5.2, abs=1e-3)
    assert report.wait_share == pytest.approx(1.0 / 5.0)
    assert report.wait_share_wall == pytest.approx(1.2 / 5.2, abs=1e-4)
    assert report.actions_executed == 8
    assert report.actions_per_phone_s == pytest.approx(8 / (10.4 / 2.0), abs=1e-3)
    assert (report.phones_per_worker_max, report.workers_used) == (2, 2)


def test_superseded_steps_are_counted_apart_and_not_as_late() -> None:
    cfg = AgentSimConfig(engine="sim", phones=1, steps=3)
    recs = [rec(k, router=0, dispatch=0, queue=0, prefill=0.1, decode=0.15) for k in range(3)]
    recs[0].status, recs[0].code = "superseded", "superseded"
    recs[2].status, recs[2].code = "error", "answer_cut"
    report = summarise(cfg, recs, wall=1.0, times=[PhoneTime(end=1.0)])
    assert (report.superseded, report.cut_answers) == (1, 1)
    assert report.errors == {"error:answer_cut": 1}  # superseded is not an error
    assert report.modelled is not None and report.modelled.steps == 2
    assert math.isinf(report.modelled.p99_ms)  # the cut answer is a step not served


def test_a_load_with_an_invalid_action_fails_whatever_its_latency() -> None:
    cfg = AgentSimConfig(engine="sim", phones=1, steps=2, action_format="compact")
    recs = [rec(k, router=0, dispatch=0, queue=0, prefill=0.1, decode=0.1) for k in range(2)]
    recs[0].valid = True  # the other ok answer did not parse as compact
    report = summarise(cfg, recs, wall=1.0, times=[PhoneTime(end=1.0, waiting_ideal=1.0)])
    res = judge(report, target_ms=500, min_loop_efficiency=0.99)
    assert not res.passed and res.reason.startswith("1 invalid actions")
    assert limit_of(None, res) == "invalid actions"
    recs[1].valid = True
    passed = judge(summarise(cfg, recs, 1.0, [PhoneTime(end=1.0, waiting_ideal=1.0)]), 500)
    assert passed.passed, passed.reason
    slow = judge(summarise(cfg, recs, 1.0, [PhoneTime(end=1.0, waiting_ideal=0.9)]), 500)
    assert not slow.passed and slow.reason.startswith("harness-bound")
    assert limit_of(None, slow) == "harness"


def test_a_load_that_evicted_an_active_sessions_kv_fails_whatever_its_latency() -> None:
    cfg = AgentSimConfig(engine="sim", phones=1, steps=2, action_format="compact")
    recs = [rec(k, router=0, dispatch=0, queue=0, prefill=0.1, decode=0.1) for k in range(2)]
    for r in recs:
        r.valid = True
    times = [PhoneTime(end=1.0, waiting_ideal=1.0)]
    assert judge(summarise(cfg, recs, 1.0, times), 500).passed
    recs[1].evicted_active = 3  # its admission evicted 3 blocks of a phone still playing
    report = summarise(cfg, recs, 1.0, times)
    assert report.active_evictions == 3
    res = judge(report, 500)
    assert not res.passed and res.active_evictions == 3
    assert res.reason == "3 KV blocks of active sessions evicted"
    assert limit_of(None, res) == "KV capacity"


def test_history_entries_are_one_line_in_the_steps_format() -> None:
    actions: list[Action] = [Click(x=5, y=6), Swipe(x1=1, y1=2, x2=3, y2=4, ms=250),
                             TypeText(text="hi you")]  # fmt: skip
    assert history_entry(actions, "compact") == "click 5 6; swipe 1 2 3 4 250; type hi you"
    assert history_entry(actions[:1], "json") == '{"type":"click","x":5,"y":6}'


@pytest.mark.parametrize(
    "bad",
    [{"chunk": 6}, {"chunk": 0}, {"window": 0}, {"act_ms": -1.0}, {"lead_ms": -1.0},
     {"gpu": "a100"}, {"engine": "sim", "gpu": "tpu"}, {"steps": 2, "ramp_steps": 2},
     # fp8 needs the sim and a card with FP8: the default card (a100) has none.
     {"precision": "fp8"}, {"engine": "sim", "precision": "fp8"},
     {"engine": "sim", "gpu": "rtx5090", "precision": "int4"},
     {"max_num_batched_tokens": 512}, {"scheduling_policy": "priority"},
     {"engine": "sim", "max_num_batched_tokens": 0},
     {"engine": "sim", "scheduling_policy": "edf"}],
)  # fmt: skip
def test_a_config_that_cannot_describe_a_run_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(AgentSimConfigError):
        AgentSimConfig(**bad)  # type: ignore[arg-type]


def test_phone_time_in_wall_seconds_follows_the_delay_scale() -> None:
    cfg = AgentSimConfig(engine="sim", delay_scale=4.0, chunk=3, act_ms=250, asynchronous=True)
    assert cfg.lead_s == pytest.approx(1.0)  # one action, 250 ms x 4
    assert replace(cfg, lead_ms=600).lead_s == pytest.approx(2.4)
    assert AgentSimConfig(chunk=3, act_ms=250).lead_s == 0.0  # sync: after the chunk


def test_bisection_stops_within_ten_percent_of_the_passing_load() -> None:
    # Resolution 1 would bisect 300..400 down to one phone; 10 % of 325 ends it at 25 apart.
    assert search(333, [50, 100, 200, 400], resolution=1) == [50, 100, 200, 400, 300, 350, 325]
    assert search(7, [5, 10], resolution=1) == [5, 10, 7, 8]  # small loads: to the phone


def test_the_limit_tells_own_decode_from_decode_slowed_by_others_prefill() -> None:
    # 20 output tokens on the a100 anchor (folded Qwen2.5-VL-7B):
    # 20 x (1 + 11.95 + 0.0683) ms = 260.4 ms alone.
    recs = [rec(k, router=0, dispatch=0, queue=0, prefill=0.14, decode=0.39) for k in range(10)]
    for r in recs:
        r.output_tokens, r.calibration = 20, "a100@qwen2.5-vl-7b"
    m = modelled_latency(recs, scale=1.0, loop_s=10.0, ideal_s=10.0)
    assert m is not None and m.tail_output_tokens == 20.0
    assert m.tail_decode_alone_ms == pytest.approx(260.4, abs=0.1)
    fail = LoadResult(16, 10, 10, 0, {}, 0, 0.0, 0.0, m, False, "")
    text = explain_limit(None, fail)
    assert "would decode in 260.4 ms alone on the GPU, the other 129.6 ms were decode" in text
    # Off the presets (a default or overridden sim) the split is not claimed.
    recs[0].calibration = None
    m = modelled_latency(recs, scale=1.0, loop_s=10.0, ideal_s=10.0)
    assert m is not None and m.tail_decode_alone_ms is None
    assert "alone" not in explain_limit(None, LoadResult(16, 10, 10, 0, {}, 0, 0.0, 0.0, m,
                                                         False, ""))  # fmt: skip


def test_the_best_budget_serves_the_most_phones_then_the_lowest_tail() -> None:
    assert best_setting([(512, 40, 480.0), (8192, 35, 300.0)]) == 512
    assert best_setting([(512, 40, 480.0), (2048, 40, 450.0), (8192, 40, 470.0)]) == 2048
    # The same phones and tail: the larger budget, fewer engine steps per prefill.
    assert best_setting([(512, 40, 450.0), (8192, 40, 450.0)]) == 8192
    assert best_setting([(256, None, None), (512, 10, 400.0)]) == 512
    assert best_setting([(256, None, None)]) is None


def test_the_started_workers_get_the_agent_pools_budget_for_their_gpu() -> None:
    assert AgentSimConfig(engine="sim", gpu="rtx5090").token_budget == 512
    assert AgentSimConfig(engine="sim", gpu="h100").token_budget is None  # the sim's 8,192
    assert (
        AgentSimConfig(engine="sim", gpu="rtx5090", max_num_batched_tokens=8192).token_budget
        == 8192
    )
    assert AgentSimConfig().token_budget is None  # llamacpp: no such knob


def test_stalls_give_the_phones_p99_and_the_share_of_chunks_without_a_successor() -> None:
    cfg = AgentSimConfig(engine="sim", phones=2, steps=3, chunk=3, act_ms=1200,
                         asynchronous=True)  # fmt: skip
    recs = [rec(k, router=0, dispatch=0, queue=0, prefill=0.1, decode=0.2) for k in range(3)]
    for r in recs:
        r.valid = True
    # 100 chunk ends: 97 found their successor in, three stood 0.05, 0.08 and 0.3 s.
    times = [
        PhoneTime(end=1.0, waiting_ideal=1.0, stalls=[0.0] * 49 + [0.3], pending_tokens=[8]),
        PhoneTime(end=1.0, waiting_ideal=1.0, stalls=[0.0] * 48 + [0.05, 0.08],
                  pending_tokens=[12, 10]),
    ]  # fmt: skip
    report = summarise(cfg, recs, 1.0, times)
    assert report.chunk_ends == 100 and report.starved_share == pytest.approx(0.03)
    assert (report.stall_p50_ms, report.stall_p99_ms) == (0.0, 80.0)
    assert report.pending_tokens_mean == 10.0
    stall = judge(report, 100, slo="stall")
    assert stall.passed, stall.reason
    assert stall.stall_p99_ms == 80.0 and stall.starved_share == pytest.approx(0.03)
    assert not judge(report, 50, slo="stall").passed
    # The step objective reads the step's p99 (300 ms here), not the stalls.
    assert judge(report, 500).passed and not judge(report, 250).passed


def test_a_role_search_tries_colocated_and_prefill_heavy_splits() -> None:
    assert role_splits(8) == ["8b", "7p1d", "6p2d", "5p3d", "4p4d"]
    assert role_splits(2) == ["2b", "1p1d"] and role_splits(1) == ["1b"]


def test_agent_sim_roles_name_every_worker_and_pair_prefill_with_decode() -> None:
    assert AgentSimConfig(engine="sim", workers=3, roles="2p1d").roles == "2p1d"
    with pytest.raises(AgentSimConfigError, match="name 3 workers, not 4"):
        AgentSimConfig(engine="sim", workers=4, roles="2p1d")
    with pytest.raises(AgentSimConfigError, match="prefill and decode go together"):
        AgentSimConfig(engine="sim", workers=2, roles="2p")
    with pytest.raises(AgentSimConfigError, match="counts of p, d or b"):
        AgentSimConfig(engine="sim", workers=2, roles="two")
