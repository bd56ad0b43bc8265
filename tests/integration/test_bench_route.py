"""`sy bench route` drives the real router and workers: small runs on the test NATS.

Each policy gets a fresh in-process fleet (router + 4 sim workers) on a private pool.
Small enough to be quick (16 episodes x 4 steps; a few dozen chat requests), big
enough that round robin scatters a thread over the workers and no KV cache evicts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from switchyard.bench.route import RouteConfig, run_route_bench
from switchyard.bench.routeload import ChatConfig
from switchyard.scheduling.affinity import POLICIES

WORKERS = 4


def sy(args: str) -> str:
    """`sy <args>` as its own process (the CLI configures logging for its process: in
    this one, CliRunner's captured stderr would be closed under later tests); stdout."""
    argv = [sys.executable, "-m", "switchyard.cli.app", *args.split()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def agent(nats_url: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = json.loads(
        sy(f"bench route --workload agent --workers {WORKERS} --sessions 16 --steps 4 "
           f"--delay-scale 0.2 --seed 3 --nats {nats_url} --json")
    )  # fmt: skip
    return out


def test_agent_json_has_one_entry_per_policy_and_every_step_ran_once(
    agent: dict[str, dict[str, Any]],
) -> None:
    assert set(agent) == {*POLICIES, "config"}
    assert agent["config"]["requests"] == 64
    assert agent["config"]["seed"] == 3
    for policy in POLICIES:
        r = agent[policy]
        assert (r["requests"], r["failed"], r["duplicates"]) == (64, 0, 0), (policy, r)
        assert sum(r["worker_requests"]) == 64
        assert len(r["worker_requests"]) == WORKERS
        assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"]
        assert r["ttft_p50_ms"] < r["request_p50_ms"] <= r["request_p99_ms"]
        assert r["load_imbalance"] >= 1.0


def test_round_robin_spreads_sessions_and_switchyard_keeps_them(
    agent: dict[str, dict[str, Any]],
) -> None:
    rr, sy = agent["round_robin"], agent["switchyard"]
    assert rr["stickiness"] < 0.75
    assert sy["stickiness"] >= 0.9
    # A step's history is cached only where the episode's previous step ran.
    assert sy["prefix_hit_rate_after_first"] > rr["prefix_hit_rate_after_first"]


def test_chat_requests_complete_and_switchyard_spreads_the_busiest_tenant(nats_url: str) -> None:
    chat = ChatConfig(tenants=3, conversations=12, turns=3, one_shots=12, concurrency=8, seed=1)
    cfg = RouteConfig(
        workload="chat", workers=WORKERS, delay_scale=0.2, seed=1, chat=chat,
        policies=("round_robin", "switchyard"), nats_url=nats_url,
    )  # fmt: skip
    bench = run_route_bench(cfg)
    assert list(bench.results) == ["round_robin", "switchyard"]
    for r in bench.results.values():
        assert (r.requests, r.failed, r.duplicates) == (chat.requests, 0, 0)
        assert sum(r.tenant_requests.values()) == chat.requests
        assert r.busiest_tenant == "t0"
    rr, sy = bench.results["round_robin"], bench.results["switchyard"]
    # No session: the router places each conversation by its prompt prefix, so the
    # busiest tenant is not pinned to one worker and its conversations stay put.
    assert sy.busiest_tenant_workers >= WORKERS - 1
    assert sy.stickiness > rr.stickiness
    assert sy.prefix_hit_rate_after_first > rr.prefix_hit_rate_after_first


def test_the_chat_table_shows_the_policies_and_the_tenants_reach(nats_url: str) -> None:
    table = sy(f"bench route --workload chat --workers 2 --tenants 2 --conversations 2 "
               f"--turns 2 --one-shots 2 --lanes 2 --delay-scale 0.2 --policy round_robin "
               f"--policy switchyard --nats {nats_url}")  # fmt: skip
    for label in ("round_robin", "switchyard", "conversation stickiness",
                  "busiest tenant's workers", "6/0"):  # fmt: skip
        assert label in table
