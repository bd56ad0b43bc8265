"""`sy agent-sim`'s phones on real NATS: preprocessor, router and one `sim` worker.

- A synchronous phone executes the K actions of an answer, `act_ms` each, before it
  captures and sends its next frame.
- An asynchronous phone sends its next step while the chunk still executes (when its
  last action starts), so it waits only for the first answer.
- When an asynchronous phone has run out of actions before its next answer, it sends a
  fresher step; the fleet answers the older one `superseded`, which the phone counts
  apart from errors and never executes.
- An answer that reaches the phone after its frame went stale is refused, never executed.
- A phone whose clock is 5 s fast or slow has its fresh steps served, not dropped stale.

The worker has one engine slot at real-time speed (delay scale 1), so steps of
several phones queue behind each other, as on a loaded GPU.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from switchyard.agentactions import longest_answers
from switchyard.agentprompt import pending_text
from switchyard.bench.agentsim import AgentSimConfig, StepRecord, play, summarise
from switchyard.bus.connection import connect
from switchyard.config import Settings
from switchyard.engines.sim_tokens import pseudo_tokens
from switchyard.ids import new_id
from tests.support.fleet import (
    preprocessor_in_process,
    provision_pool,
    router_in_process,
    wait_for_pool,
    worker_in_process,
)

CFG = AgentSimConfig(
    engine="sim", workers=1, width=320, height=180, stale_after=30.0, frame_pool=2,
    delay_scale=1.0, action_format="compact",
)  # fmt: skip
TIMER = 0.005  # s: what an event loop's timer may be off by


@pytest.fixture(scope="module")
async def phone_fleet(nats_url: str) -> AsyncIterator[str]:
    """Router, one single-slot sim worker and the preprocessor for a private pool."""
    pool = f"ph{new_id().lower()[-10:]}"
    bus = await connect(Settings(nats_url=nats_url), "pytest-phones")
    await provision_pool(bus.js, pool)
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("SY_SIM_MAX_NUM_SEQS", "1")
            env.setenv("SY_SIM_DELAY_SCALE", "1")
            async with contextlib.AsyncExitStack() as stack:
                await stack.enter_async_context(
                    router_in_process(nats_url, partitions=4, pools=[pool],
                                      rebalance_interval=0.2)
                )  # fmt: skip
                await stack.enter_async_context(
                    worker_in_process(nats_url, pool=pool, engine="sim", assignment="kv",
                                      worker_id=f"{pool}-w0")
                )  # fmt: skip
                await stack.enter_async_context(
                    preprocessor_in_process(nats_url, agent_pool=pool, frame_procs=0)
                )
                await wait_for_pool(bus.js, pool, 1)
                yield nats_url
    finally:
        await bus.close()


def phones(url: str, **changes: object) -> AgentSimConfig:
    return replace(CFG, nats_url=url, tenant=f"ph{new_id().lower()[-8:]}", **changes)  # type: ignore[arg-type]


def by_step(recs: list[StepRecord]) -> list[StepRecord]:
    return sorted(recs, key=lambda r: (r.phone, r.step))


async def test_a_sync_phone_executes_its_chunk_before_the_next_frame(phone_fleet: str) -> None:
    cfg = phones(phone_fleet, phones=1, steps=3, chunk=3, act_ms=150, ramp_steps=1)
    played = await play(cfg, phone_fleet)

    recs = by_step(played.records)
    assert [r.status for r in recs] == ["ok"] * 3, [(r.status, r.code) for r in recs]
    assert all(r.valid and r.executed and r.actions == 3 and not r.early for r in recs)
    act = 0.15
    for a, b in itertools.pairwise(recs):
        assert a.taken_at is not None and a.taken_at >= a.sent + a.latency_s - TIMER
        # The next frame is captured only after the whole chunk ran.
        assert b.sent >= a.taken_at + 3 * act - TIMER, b.sent - a.taken_at
    # The phone's time counts from the end of the ramp (step 0 and its chunk).
    (t,) = played.times
    assert t.actions == 6 and t.acting == pytest.approx(6 * act)
    first = recs[0].taken_at
    assert first is not None and t.start >= first + 3 * act - TIMER
    assert t.switches == 0 and t.dropped == 0
    # Each chunk that had a successor left the phone standing for that step's latency
    # (modelled: its measured and modelled parts), and no step carried pending actions.
    assert len(t.stalls) == 2 and t.pending_tokens == []
    for stood, r in zip(t.stalls, recs[1:], strict=True):
        model = r.modelled(cfg.delay_scale)
        assert model is not None and 0 < stood <= model + 0.1, (stood, model)
    report = summarise(cfg, played.records, played.wall_s, played.times)
    assert report.actions_executed == 6 and report.superseded == 0 and report.errors == {}
    assert report.starved_share == 1.0 and report.stall_p99_ms > 0
    assert report.modelled is not None and report.modelled.steps == 2  # the ramp left out
    assert 0 < report.wait_share < 1 and report.actions_per_phone_s > 0
    assert report.calibration == "a100"


async def test_an_async_phone_sends_its_next_step_while_the_chunk_executes(
    phone_fleet: str,
) -> None:
    act = 0.8  # s: longer than a step takes on an idle single-slot worker
    cfg = phones(phone_fleet, phones=1, steps=3, chunk=2, act_ms=act * 1000, asynchronous=True)
    played = await play(cfg, phone_fleet)

    recs = by_step(played.records)
    assert [r.status for r in recs] == ["ok"] * 3, [(r.status, r.code) for r in recs]
    assert all(r.executed for r in recs) and [r.early for r in recs] == [False, True, True]
    for a, b in itertools.pairwise(recs):
        assert a.taken_at is not None
        # Sent when the chunk's last action started: after the first, before the chunk ended.
        assert a.taken_at + act - TIMER <= b.sent < a.taken_at + 2 * act, b.sent - a.taken_at
        assert b.sent + b.latency_s < a.taken_at + 2 * act  # in before the actions ran out
    (t,) = played.times
    assert t.actions == 6 and t.dropped == 0
    # The phone waited for its first answer only: the others came while it was acting.
    assert t.waiting < recs[0].latency_s + 0.1, (t.waiting, recs[0].latency_s)
    # So its two chunk ends with a successor found it in: no stall. Each early step named
    # the action under way (`pending`: one compact line, no longer than the widest action).
    assert t.stalls == [0.0, 0.0]
    lines = longest_answers("compact", 1, False)
    widest = max(len(pseudo_tokens(pending_text([line]))) for line in lines)
    assert len(t.pending_tokens) == 2 and all(0 < n <= widest for n in t.pending_tokens)
    report = summarise(cfg, played.records, played.wall_s, played.times)
    assert report.wait_share < 0.25 and report.superseded == 0
    assert (report.chunk_ends, report.stall_p99_ms, report.starved_share) == (2, 0.0, 0.0)
    assert report.refused_late == 0


async def test_superseded_answers_are_counted_apart_and_never_executed(
    phone_fleet: str,
) -> None:
    # Four phones on one slot: a step waits for the others' steps, far longer than the
    # phone's 30 ms action, so the phone sends a fresher step while the older one queues.
    cfg = phones(phone_fleet, phones=4, steps=5, chunk=1, act_ms=30, asynchronous=True)
    played = await play(cfg, phone_fleet)

    report = summarise(cfg, played.records, played.wall_s, played.times)
    superseded = [r for r in played.records if r.status == "superseded"]
    assert superseded, [(r.status, r.code) for r in played.records]
    assert report.superseded == len(superseded) and report.errors == {}
    assert not any(r.executed or r.valid for r in superseded)
    assert report.ok + report.superseded == report.steps == 4 * 5
    executed = [r for r in played.records if r.executed]
    assert report.actions_executed == sum(r.actions for r in executed) - sum(
        t.dropped for t in played.times
    )
    assert report.modelled is not None and report.modelled.steps == 20 - len(superseded)


async def test_an_answer_that_reaches_the_phone_after_its_frame_went_stale_is_never_executed(
    phone_fleet: str,
) -> None:
    # One 2 s action per step and a 1 s frame budget: the step sent when the action starts
    # is answered in time (well under 1 s on an idle slot), but the phone can act on it
    # only when the action ends, 2 s after its frame. It refuses it and asks afresh.
    cfg = phones(phone_fleet, phones=1, steps=3, chunk=1, act_ms=2000, asynchronous=True,
                 stale_after=1.0)  # fmt: skip
    played = await play(cfg, phone_fleet)

    first, early, fresh = by_step(played.records)
    assert [r.status for r in (first, early, fresh)] == ["ok"] * 3
    assert early.early and early.late and not early.executed
    assert first.executed and fresh.executed and not fresh.early and not fresh.late
    (t,) = played.times
    # The action ended with no fresh answer in: the phone stood until the fresh step's.
    assert len(t.stalls) == 1 and t.stalls[0] > 0
    report = summarise(cfg, played.records, played.wall_s, played.times)
    assert report.refused_late == 1 and report.starved_share == 1.0


@pytest.mark.parametrize("skew", [5.0, -5.0])
async def test_a_skewed_phone_clock_has_its_fresh_steps_served(
    phone_fleet: str, skew: float
) -> None:
    # A 3 s budget: judged on the phone's clock as it stands, -5 s would make every frame
    # 5 s old on arrival. The fleet estimates the offset and serves them all.
    cfg = phones(phone_fleet, phones=1, steps=3, stale_after=3.0, clock_skew_s=skew)
    played = await play(cfg, phone_fleet)
    recs = by_step(played.records)
    assert [(r.status, r.code) for r in recs] == [("ok", None)] * 3
    assert all(r.executed for r in recs)
