"""`sy bench route`: placement policies on one simulated agent workload.

Small runs (a few seconds of modelled time at delay_scale 0.05): big enough that
round-robin scatters each episode over the workers, small enough that no KV
cache evicts, so session affinity gets every history hit there is.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from switchyard.bench.route import POLICIES, RouteBench, RouteConfig, run_route_bench
from switchyard.cli.app import app


@pytest.fixture(scope="module")
def bench() -> RouteBench:
    return run_route_bench(RouteConfig(sessions=24, steps=4, workers=4, delay_scale=0.05))


def test_every_policy_completes_every_step(bench: RouteBench) -> None:
    assert list(bench.results) == list(POLICIES)
    for r in bench.results.values():
        assert (r.steps, r.failed) == (24 * 4, 0)
        assert 0 < r.ttft_p50_ms <= r.ttft_p99_ms
        assert r.ttft_p50_ms < r.step_p50_ms <= r.step_p99_ms
        assert len(r.worker_busy_s) == 4
        assert r.load_imbalance >= 1.0
        assert r.throughput_steps_per_s > 0


def test_affinity_keeps_sessions_on_one_worker_and_hits_more(bench: RouteBench) -> None:
    rr, affinity = bench.results["round_robin"], bench.results["affinity"]
    assert affinity.stickiness == 1.0
    assert rr.stickiness < 1.0
    # A step's history prefix is cached only where the episode's previous step ran.
    assert affinity.prefix_hit_rate_after_first > rr.prefix_hit_rate_after_first
    # Step 1 of an episode shares only the system prompt, whatever the policy.
    assert affinity.prefix_hit_rate < affinity.prefix_hit_rate_after_first


def test_cli_json_has_one_entry_per_policy_and_the_config() -> None:
    args = "bench route --sessions 6 --steps 2 --workers 2 --delay-scale 0.05 --seed 3 --json"
    result = CliRunner().invoke(app, args.split())
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) == {*POLICIES, "config"}
    assert out["config"]["sessions"] == 6
    assert out["config"]["seed"] == 3
    for policy in POLICIES:
        assert out[policy]["steps"] == 12
        assert set(out[policy]) >= {
            "prefix_hit_rate",
            "prefix_hit_rate_after_first",
            "ttft_p50_ms",
            "ttft_p99_ms",
            "step_p50_ms",
            "step_p99_ms",
            "load_imbalance",
            "throughput_steps_per_s",
            "stickiness",
        }


def test_cli_prints_a_table() -> None:
    result = CliRunner().invoke(app, ["bench", "route", "--sessions", "2", "--steps", "1"])
    assert result.exit_code == 0, result.output
    for policy in POLICIES:
        assert policy in result.stdout
