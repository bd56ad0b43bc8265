"""Link classes between GPUs from the workers' locations (#39, scheduling/links.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.worker.settings import WorkerSettings
from switchyard.messages.fleet import WorkerHeartbeat
from switchyard.scheduling.links import distance, link_class

# `nvidia-smi topo -m` of the seeds' 8 x RTX 5090 ([S0] intro), row by row.
SEEDS_TOPO = """
X    PIX  NODE NODE SYS  SYS  SYS  SYS
PIX  X    NODE NODE SYS  SYS  SYS  SYS
NODE NODE X    PIX  SYS  SYS  SYS  SYS
NODE NODE PIX  X    SYS  SYS  SYS  SYS
SYS  SYS  SYS  SYS  X    PIX  NODE NODE
SYS  SYS  SYS  SYS  PIX  X    NODE NODE
SYS  SYS  SYS  SYS  NODE NODE X    PIX
SYS  SYS  SYS  SYS  NODE NODE PIX  X
"""


def test_the_seeds_machine_as_compose_locates_its_gpus_gives_its_topology_matrix() -> None:
    # compose/docker-compose.yml: GPU i at gpu-server/<i // 4>/<i // 2>.
    at = [f"gpu-server/{i // 4}/{i // 2}" for i in range(8)]
    rows = [line.split() for line in SEEDS_TOPO.strip().splitlines()]
    for i, row in enumerate(rows):
        for j, want in enumerate(row):
            if i != j:
                assert link_class(at[i], at[j]) == want, (i, j)


def test_other_machines_and_unknown_locations_are_the_farthest() -> None:
    assert link_class("a/0/0", "b/0/0") == "NET"
    assert link_class("a", "b") == "NET"
    assert link_class("", "a/0/0") == link_class("a/0/0", "") == "NET"
    # A bare host name twice: one machine, its sockets unknown.
    assert link_class("a", "a") == "SYS"
    assert link_class("a/1", "a/1") == "NODE"
    assert [distance("a/0/0", b) for b in ("a/0/0", "a/0/1", "a/1/2", "b/0/0")] == [0, 1, 2, 3]


def test_a_worker_announces_its_location_and_refuses_a_malformed_one() -> None:
    s = WorkerSettings(worker_topology="gpu-server/1/3")
    assert s.worker_topology == "gpu-server/1/3"
    assert WorkerSettings().worker_topology  # the host name by default
    for bad in ("", "a/b/c/d", "a//b", "a b"):
        with pytest.raises(ValidationError):
            WorkerSettings(worker_topology=bad)
    hb = WorkerHeartbeat(worker="w", pool="p", engine="sim", at=1.0, slots=1, topology="h/0/1")
    assert hb.topology == "h/0/1"
    # A heartbeat from before locations (no field) reads as unknown.
    assert WorkerHeartbeat(worker="w", pool="p", engine="sim", at=1.0, slots=1).topology == ""
