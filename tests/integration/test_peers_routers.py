"""The peers really front our sim servers: vllm-router and smg over two `sy sim-server`s.

Skipped only when a peer's launcher is not installed (the `bench` extra)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from switchyard.bench.peers import peers, simfleet
from switchyard.bench.peers.cpu import LOAD_GENERATOR
from switchyard.bench.peers.overhead import (
    SMG,
    SY_EDGE,
    SY_NATS,
    OverheadConfig,
    run_overhead,
    traced,
)
from switchyard.bench.peers.routing import RoutingConfig, run_routing
from switchyard.bench.peers.stats import parse_metrics
from switchyard.bench.routeload import ChatConfig
from switchyard.fleet import FleetError, ProcessGroup
from switchyard.ports import free_port


def _installed(name: str) -> bool:
    try:
        peers.binary(name)
    except FleetError:
        return False
    return True


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessGroup]:
    with ProcessGroup(Path(tmp_path_factory.mktemp("peers"))) as g:
        yield g


@pytest.fixture(scope="module")
def backends(group: ProcessGroup) -> list[str]:
    return simfleet.start_sim_servers(group, 2, delay_scale=0.0)


def _served(urls: list[str]) -> list[float]:
    return [
        parse_metrics(httpx.get(f"{u}/metrics").text).get("vllm:request_success_total", 0.0)
        for u in urls
    ]


def _start(group: ProcessGroup, cmd: peers.PeerCommand) -> str:
    asyncio.run(peers.start(group, cmd))
    return cmd.url


@pytest.mark.skipif(not _installed(peers.VLLM_ROUTER), reason="vllm-router is not installed "
                    "(pip install -e '.[bench]')")  # fmt: skip
def test_vllm_router_fronts_sim_servers_and_keeps_a_session_on_one(
    group: ProcessGroup, backends: list[str]
) -> None:
    url = _start(group, peers.command(peers.VLLM_ROUTER, backends, "consistent_hash"))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    before = _served(backends)
    for _ in range(4):
        out = client.chat.completions.create(
            model=simfleet.MODEL, messages=[{"role": "user", "content": "Next action?"}],
            max_tokens=3, extra_headers={"X-Session-ID": "episode-7"},
        )  # fmt: skip
        assert out.choices[0].message.content
        assert out.usage is not None and out.usage.completion_tokens == 3
    grew = sorted(a - b for a, b in zip(_served(backends), before, strict=True))
    assert grew == [0.0, 4.0]  # one session, one backend
    stream = client.chat.completions.create(
        model=simfleet.MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        stream=True,
    )  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


@pytest.mark.skipif(not _installed(peers.SMG), reason="smg is not installed "
                    "(pip install -e '.[bench]')")  # fmt: skip
def test_smg_fronts_sim_servers(group: ProcessGroup, backends: list[str]) -> None:
    url = _start(group, peers.command(peers.SMG, backends, "cache_aware"))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    before = _served(backends)
    out = client.chat.completions.create(
        model=simfleet.MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert out.usage is not None and out.usage.completion_tokens == 5
    assert sum(_served(backends)) - sum(before) == 1


def test_a_peer_that_cannot_start_fails_with_its_log(tmp_path: Path) -> None:
    with ProcessGroup(tmp_path) as g:
        child = g.start(
            "broken-peer", [sys.executable, "-c", "print('bad flag'); raise SystemExit(2)"]
        )
        with pytest.raises(FleetError, match="broken-peer exited with status 2") as e:
            g.wait_http(child, f"http://127.0.0.1:{free_port()}/health", timeout=10)
        assert "bad flag" in str(e.value)


@pytest.mark.skipif(not _installed(peers.VLLM_ROUTER), reason="vllm-router is not installed "
                    "(pip install -e '.[bench]')")  # fmt: skip
def test_the_routing_run_sends_the_chat_workload_through_a_peer(tmp_path: Path) -> None:
    chat = ChatConfig(tenants=2, conversations=3, turns=2, one_shots=2, concurrency=2, seed=1)
    cfg = RoutingConfig(
        backends=2, delay_scale=0.0, policies=("vllm-router round_robin",), workload="chat",
        chat=chat,
    )  # fmt: skip
    row = run_routing(cfg, tmp_path).rows["vllm-router round_robin"]
    assert (row.requests, row.failed) == (chat.requests, 0)
    # Round robin over two backends: every other request, whoever sent it.
    assert row.requests_per_backend == [chat.requests // 2] * 2
    assert set(row.tenant_backends) == {"t0", "t1"}
    assert row.busiest_tenant == "t0" and row.busiest_tenant_backends == 2


@pytest.mark.skipif(not (_installed(peers.VLLM_ROUTER) and _installed(peers.SMG)),
                    reason="a peer is not installed (pip install -e '.[bench]')")  # fmt: skip
def test_the_overhead_run_reports_hops_and_cpu_per_process_for_both_paths(
    tmp_path: Path,
) -> None:
    # Blocks of 40: the idle bound below (two 10 ms ticks a block) is 0.5 ms a request,
    # well under what the edge path bills the edge (1.0-2.3 ms a request measured); with
    # blocks of 20 it was 1.0 ms, which the edge's bill met once on a loaded machine.
    cfg = OverheadConfig(requests=80, concurrency=4, block=40, warmup=4)
    result = run_overhead(cfg, tmp_path)
    assert {c.errors for c in result.columns.values()} == {0}
    edge, nats = result.columns[SY_EDGE], result.columns[SY_NATS]
    # The NATS path reads its hops from the results' routes, the edge path from the
    # answer's Server-Timing header; the edge prepares its chat itself (`prepare`).
    assert nats.hops_p50_ms is not None and set(nats.hops_p50_ms) == {
        "to_router", "router", "to_worker", "engine", "back"}  # fmt: skip
    assert edge.hops_p50_ms is not None and {"prepare", "to_worker", "http"} <= set(
        edge.hops_p50_ms
    )
    fleet = {"router", "worker", "nats-server", LOAD_GENERATOR}
    for column, busy in ((nats, fleet), (edge, fleet | {"edge"})):
        cpu = column.cpu_ms_per_request or {}
        assert all(cpu.get(p, 0.0) > 0.05 for p in busy), cpu
    assert "preprocessor" not in (edge.cpu_ms_per_request or {})  # no such hop, no process
    # A path does not bill the processes it does not use beyond their idle background,
    # which the kernel's accounting rounds to whole clock ticks (10 ms): each block's
    # user and system times may each cross one tick boundary of an idle process.
    # (0.25 ms a request was measured here under load: one tick over 40 requests.)
    blocks = cfg.requests // cfg.block
    idle_ms = 2 * blocks * 1000 / os.sysconf("SC_CLK_TCK") / cfg.requests
    billed = (result.columns[SMG].cpu_ms_per_request or {}).get("edge", 0.0)
    assert billed <= idle_ms < (edge.cpu_ms_per_request or {})["edge"], (billed, idle_ms)


@pytest.mark.skipif(not (_installed(peers.VLLM_ROUTER) and _installed(peers.SMG)),
                    reason="a peer is not installed (pip install -e '.[bench]')")  # fmt: skip
def test_the_overhead_run_adds_a_traced_edge_column_per_sampling_ratio(tmp_path: Path) -> None:
    """`--trace-sample 1`: a fleet of its own with OpenTelemetry on, exporting every span
    to the run's OTLP sink (tests/unit/test_otel.py: the sink takes the SDK's export),
    measured beside the untraced edge."""
    cfg = OverheadConfig(requests=40, concurrency=4, block=20, warmup=4, trace_samples=(1.0,))
    result = run_overhead(cfg, tmp_path)
    assert list(result.columns)[-1] == traced(1.0) == "switchyard edge, traced 100%"
    assert {c.errors for c in result.columns.values()} == {0}
