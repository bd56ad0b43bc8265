"""Provisioning is idempotent and refuses, clearly, to clobber an incompatible stream."""

from __future__ import annotations

import pytest

from switchyard.bus.connection import Bus
from switchyard.bus.provision import ensure_bucket, ensure_stream, provision
from switchyard.bus.topology import BucketSpec, StreamSpec, TopologySettings, build_topology
from switchyard.errors import ProvisioningError


async def test_full_topology_is_idempotent(bus: Bus) -> None:
    topology = build_topology(TopologySettings(partitions=8))
    await provision(bus.js, topology)
    again = await provision(bus.js, topology)
    assert {c.action for c in again} == {"unchanged"}
    names = {s.config.name for s in await bus.js.streams_info()}
    assert {"INGRESS", "REQ", "WORK", "RES", "AUDIT", "DLQ"} <= names
    assert {"KV_fleet_workers", "KV_fleet_assignments", "KV_idempotency"} <= names
    info = await bus.js.consumer_info("WORK", "work-agent-p7")
    assert info.config.filter_subject == "work.agent.p7"


async def test_mutable_drift_is_updated_in_place(bus: Bus, unique: str) -> None:
    spec = StreamSpec(f"T{unique}", (f"t.{unique}.>",), "limits", 3600)
    assert (await ensure_stream(bus.js, spec)).action == "created"
    changed = StreamSpec(f"T{unique}", (f"t.{unique}.>",), "limits", 7200)
    change = await ensure_stream(bus.js, changed)
    assert change.action == "updated" and "max_age" in change.detail
    assert (await ensure_stream(bus.js, changed)).action == "unchanged"


async def test_incompatible_stream_is_reported_not_recreated(bus: Bus, unique: str) -> None:
    await ensure_stream(bus.js, StreamSpec(f"T{unique}", (f"t.{unique}.>",), "limits", 0))
    await bus.js.publish(f"t.{unique}.keep", b"precious")
    wrong = StreamSpec(f"T{unique}", (f"t.{unique}.>",), "workqueue", 0, "memory")
    with pytest.raises(ProvisioningError) as info:
        await ensure_stream(bus.js, wrong)
    assert "retention is limits, declared workqueue" in info.value.reason
    assert "storage is file, declared memory" in info.value.reason
    assert (await bus.js.stream_info(f"T{unique}")).state.messages == 1  # nothing lost


async def test_a_buckets_ttl_is_changed_in_place(bus: Bus, unique: str) -> None:
    await ensure_bucket(bus.js, BucketSpec(f"b{unique}", 10))
    kv = await bus.js.key_value(f"b{unique}")
    await kv.put("k", b"kept")
    assert (await ensure_bucket(bus.js, BucketSpec(f"b{unique}", 10))).action == "unchanged"
    changed = await ensure_bucket(bus.js, BucketSpec(f"b{unique}", 30))
    assert (changed.action, changed.detail) == ("updated", "ttl 10 -> 30 s")
    assert (await kv.status()).ttl == 30
    assert (await kv.get("k")).value == b"kept"
