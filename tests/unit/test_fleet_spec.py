"""`FleetSpec` -> the services a launch starts, in order, and what "ready" means for them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from switchyard.apikeys import hash_key
from switchyard.fleet import UNMETERED, Edge, FleetSpec, Pool, PoolReady, env_of
from switchyard.fleet.spec import role_split


def test_settings_fields_become_the_variables_services_read() -> None:
    assert env_of(pools=["a", "b"], draining=True, delay_scale=0.5, policy=Path("/p")) == {
        "SY_POOLS": '["a", "b"]', "SY_DRAINING": "true", "SY_DELAY_SCALE": "0.5",
        "SY_POLICY": "/p",
    }  # fmt: skip


def test_a_routed_fleet_starts_consumers_before_producers(tmp_path: Path) -> None:
    spec = FleetSpec(
        pools=(Pool("llm", 2, {"SY_SIM_DELAY_SCALE": "0"}), Pool("agent")), partitions=8,
        services=("preprocessor", "router", "validator"), tenant_policy=UNMETERED,
        edge=Edge(port=8123, keys={"sk-1": "acme"}), env={"SY_LOG_LEVEL": "warning"},
        service_env={"preprocessor": {"SY_FRAME_PROCS": "0"}},
    )  # fmt: skip
    roster = spec.roster(tmp_path)
    names = [s.name for s in roster.services]
    assert names == ["validator", "llm-w0", "llm-w1", "agent-w0", "router", "preprocessor", "edge"]
    by = {s.name: s for s in roster.services}
    assert all(s.env["SY_PARTITIONS"] == "8" and s.env["SY_LOG_LEVEL"] == "warning"
               for s in roster.services)  # fmt: skip
    assert by["llm-w1"].module == "services.worker"
    assert by["llm-w1"].argv == (sys.executable, "-m", "services.worker")
    assert {k: by["llm-w1"].env[k] for k in ("SY_POOL", "SY_WORKER_ID", "SY_ASSIGNMENT")} == {
        "SY_POOL": "llm", "SY_WORKER_ID": "llm-w1", "SY_ASSIGNMENT": "kv"}  # fmt: skip
    assert by["llm-w1"].env["SY_SIM_DELAY_SCALE"] == "0"
    assert "SY_SIM_DELAY_SCALE" not in by["agent-w0"].env
    assert by["router"].env["SY_POOLS"] == '["llm", "agent"]'
    assert yaml.safe_load(Path(by["router"].env["SY_TENANT_POLICY"]).read_text()) == UNMETERED
    assert by["preprocessor"].env["SY_FRAME_PROCS"] == "0"
    assert "SY_TENANT_POLICY" not in by["preprocessor"].env  # only the router reads it
    keys = yaml.safe_load(Path(by["edge"].env["SY_API_KEYS_FILE"]).read_text())
    assert keys == {"keys": {hash_key("sk-1"): {"tenant": "acme"}}}
    assert roster.edge_url == "http://127.0.0.1:8123"
    assert roster.pools == (
        PoolReady("llm", 2, 8, True, ("llm-w0", "llm-w1")),
        PoolReady("agent", 1, 8, True, ("agent-w0",)),
    )


def test_without_a_router_the_workers_own_their_partitions(tmp_path: Path) -> None:
    roster = FleetSpec(pools=(Pool("bench"),), partitions=4, services=()).roster(tmp_path)
    (worker,) = roster.services
    assert worker.env["SY_ASSIGNMENT"] == "static"
    assert roster.pools == (PoolReady("bench", 1, 4, False, ("bench-w0",)),)
    assert roster.edge_url is None


def test_an_unknown_service_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown services"):
        FleetSpec(services=("rooter",)).roster(tmp_path)


def test_a_role_split_names_each_workers_role_in_order(tmp_path: Path) -> None:
    assert role_split("2p1d") == ("prefill", "prefill", "decode")
    assert role_split("1B2P") == ("both", "prefill", "prefill")
    for bad in ("", "p2", "0p1d", "2x", "2p 1d", "auto"):
        with pytest.raises(ValueError, match="counts of p, d or b"):
            role_split(bad)
    spec = FleetSpec(pools=(Pool("agent", 3, roles=role_split("2p1d")), Pool("llm")))
    env = {s.name: s.env for s in spec.roster(tmp_path).services}
    assert [env[f"agent-w{i}"]["SY_WORKER_ROLE"] for i in range(3)] == [
        "prefill", "prefill", "decode"]  # fmt: skip
    assert env["llm-w0"]["SY_WORKER_ROLE"] == "both"
    with pytest.raises(ValueError, match="2 roles for 3 workers"):
        Pool("agent", 3, roles=role_split("1p1d"))
