"""`sy agent-sim --search` at a tiny scale: real NATS, router, preprocessor, two sim workers.

The fleet is the one the CLI starts (an embedded NATS and one subprocess per
service); two searches run against it: one whose target every load meets and
one whose target none can, so both ends of the search are exercised.
"""

from __future__ import annotations

from dataclasses import replace

from switchyard.bench.agentsim import AgentSimConfig, agent_fleet, run_capacity_search

GROUPS = ("queueing", "prefill", "decode")
CFG = AgentSimConfig(
    engine="sim", workers=2, steps=3, width=320, height=180, max_tokens=16, stale_after=30.0,
    frame_pool=2, delay_scale=1.0,
)  # fmt: skip


def test_capacity_search_reports_modelled_latency_and_its_limit() -> None:
    with agent_fleet(CFG) as url:
        live = replace(CFG, nats_url=url)
        easy = run_capacity_search(live, [2, 4], target_ms=5000, resolution=1,
                                   min_loop_efficiency=0.0)  # fmt: skip
        tight = run_capacity_search(live, [2, 4], target_ms=50, resolution=1,
                                    min_loop_efficiency=0.0)  # fmt: skip

    assert [r.phones for r in easy.loads] == [2, 4]
    assert easy.capacity == 4 and easy.first_failure is None
    for r in easy.loads:
        assert r.passed and r.steps == r.phones * 3 and r.ok == r.steps and r.stale == 0
        m = r.modelled
        assert m is not None
        # At least ~8 decode steps of >= 13 ms (the shortest action, `back`, is 9 pseudo-tokens)
        # and a prefill for two small frames.
        assert m.p50_parts_ms["decode"] >= 8 * 13 and m.p50_parts_ms["prefill"] > 0
        assert 0 < m.p50_ms <= m.p99_ms < 5000
        assert m.p50_ms <= r.wall_p50_ms + 1  # the modelled part of a step never exceeds it
        assert 0 < m.loop_efficiency <= 1.0
        assert m.outside_p50_ms > 0  # the preprocessor's work is reported, not dropped
    # Which part limits depends on this machine's scheduling noise (a router wait can
    # spike); the report must name one of the three and give every component.
    assert easy.limit.split()[0] in GROUPS and "router" in easy.limit

    # No load meets 50 ms: the search stops at the first rung and says why.
    assert [r.phones for r in tight.loads] == [2]
    assert tight.capacity is None and tight.first_failure is not None
    assert "modelled p99" in tight.first_failure.reason
    assert tight.limit.split()[0] in GROUPS and "prefill" in tight.limit
