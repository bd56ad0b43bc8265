"""What `sy bench peers overhead` reads: hops from a route or a Server-Timing header, and
process names for CPU per process."""

from __future__ import annotations

import pytest

from switchyard.bench.peers.clients import hops_of, server_timing
from switchyard.bench.peers.cpu import process_name
from switchyard.messages.inference import Route


def test_route_hops_follow_the_stamps_it_has() -> None:
    edge = Route(pool="p", created_at=100.0, prepared_at=100.001, admitted_at=100.003,
                 dispatched_at=100.004, started_at=100.010, finished_at=100.020)  # fmt: skip
    hops = edge.hops(100.0225)
    assert list(hops) == ["prepare", "to_router", "router", "to_worker", "engine", "back"]
    assert hops["prepare"] == pytest.approx(0.001) and hops["to_worker"] == pytest.approx(0.006)
    assert sum(hops.values()) == pytest.approx(0.0225)
    # Published straight onto REQ: no preparation hop, to_router counts from creation.
    direct = edge.model_copy(update={"prepared_at": None})
    assert "prepare" not in direct.hops(100.03)
    assert direct.hops(100.03)["to_router"] == pytest.approx(0.003)
    # Refused before the engine: not a whole trip, no hops for the benchmark.
    assert hops_of(edge.model_copy(update={"started_at": None}), 100.03) is None


def test_server_timing_is_read_as_seconds_per_hop() -> None:
    header = "prepare;dur=1.50, to_router;dur=0.25,engine;desc=x;dur=2"
    assert server_timing(header) == {"prepare": 0.0015, "to_router": 0.00025, "engine": 0.002}
    assert server_timing(None) is None and server_timing("cache;desc=hit") is None
    assert server_timing("bad;dur=fast") is None


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["/v/bin/python", "-m", "services.router"], "router"),
        (["/v/bin/python", "-m", "services.worker"], "worker"),
        (["/x/nats-server", "-c", "n.conf"], "nats-server"),
        (["/v/bin/sy", "sim-server", "--port", "1"], "sim-server"),
        (["vllm::router"], "vllm-router"),
        (["/v/bin/python", "/v/bin/smg", "launch"], "smg"),
        (["/usr/bin/other", "x"], "other"),
    ],
)
def test_processes_are_named_by_what_they_run(argv: list[str], name: str) -> None:
    assert process_name(argv) == name
