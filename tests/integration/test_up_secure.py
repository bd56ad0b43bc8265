"""`sy up --secure`'s NATS: a throwaway CA and nkeys (`LocalSecrets`), an embedded server
(or cluster) with TLS and the production users, and a service connecting with its own
identity over TLS, refused outside its permissions and without its certificate."""

from __future__ import annotations

import asyncio
import os
import ssl
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import nats.errors
import pytest

from switchyard.bus.connection import connect
from switchyard.bus.topology import TopologySettings
from switchyard.cli.up import (
    ADMIN_USER,
    FLEET,
    LocalSecrets,
    auth_users,
    plan,
    roster,
    secure,
    start_nats,
    write_admin_env,
)
from switchyard.config import Settings
from switchyard.fleet import ProcessGroup, provision
from switchyard.fleet.errors import NotReady
from switchyard.fleet.readiness import wait_http
from switchyard.natsserver import ClusterMembership, EmbeddedNats, tls_block
from switchyard.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalSecrets:
    monkeypatch.chdir(ROOT)  # `sy up` reads compose/nats-auth.conf from the repository root
    return LocalSecrets.make(tmp_path / "nats", auth_users(), "127.0.0.1")


@pytest.fixture
def servers(
    request: pytest.FixtureRequest, secrets: LocalSecrets, tmp_path: Path
) -> Iterator[list[EmbeddedNats]]:
    started = start_nats("127.0.0.1", free_port(), tmp_path / "nats", secrets, request.param)
    try:
        yield started
    finally:
        for server in started:
            server.stop()


def test_the_secrets_are_reused_and_private(secrets: LocalSecrets, tmp_path: Path) -> None:
    again = LocalSecrets.make(tmp_path / "nats", auth_users(), "127.0.0.1")
    assert again.ca.cert.read_bytes() == secrets.ca.cert.read_bytes()
    assert again.identities == secrets.identities
    assert set(secrets.identities) == auth_users() | {ADMIN_USER}
    for identity in secrets.identities.values():
        assert stat.S_IMODE(identity.seed_file.stat().st_mode) == 0o600
    env = tmp_path / "admin.env"
    write_admin_env(env, "nats://127.0.0.1:4222", secrets)
    written = dict(line.split("=", 1) for line in env.read_text().splitlines())
    assert written["SY_NATS_USER"] == "admin"
    assert written["SY_NATS_NKEY_SEED_FILE"] == str(secrets.identities["admin"].seed_file)
    assert "SY_NATS_PASSWORD" not in written


@pytest.mark.parametrize("servers", [1], indirect=True)
async def test_a_service_connects_over_tls_as_itself(
    servers: list[EmbeddedNats], secrets: LocalSecrets
) -> None:
    url = servers[0].url
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    edge = Settings(nats_url=url, **secrets.client_settings("edge"))
    bus = await connect(edge, "test-edge", error_cb=on_error, allow_reconnect=False)
    try:
        assert bus.nc._server_info.get("tls_required") is True
        await bus.nc.publish("agent.in.acme", b"x")  # the edge's job
        await bus.nc.subscribe("audit.>")  # never the edge's
        await bus.nc.flush()
        await asyncio.sleep(0.1)
        assert any('subscription to "audit.>"' in e for e in errors), errors
        assert not any("publish" in e for e in errors), errors
    finally:
        await bus.close()
    # The edge's nkey without its certificate: the TLS handshake already fails.
    no_cert = Settings(**{**edge.model_dump(), "nats_cert": None, "nats_key": None})
    # The server drops the handshake: a reset, a broken pipe or an SSL error, by timing.
    with pytest.raises((OSError, nats.errors.Error)):
        await nats.connect(
            **no_cert.nats_options(), allow_reconnect=False, max_reconnect_attempts=0,
            connect_timeout=2,
        )  # fmt: skip


@pytest.mark.parametrize("servers", [3], indirect=True)
async def test_a_secure_cluster_routes_over_tls(
    servers: list[EmbeddedNats], secrets: LocalSecrets
) -> None:
    for server in servers:
        cluster = server.monitor("/varz")["cluster"]
        assert cluster["tls_required"] is True and cluster["tls_verify"] is True
        assert len(server.monitor("/routez")["routes"]) >= 2
    url = ",".join(s.url for s in servers)
    bus = await connect(Settings(nats_url=url, **secrets.client_settings(ADMIN_USER)), "t")
    try:
        info = await bus.js.account_info()
        assert info is not None
    finally:
        await bus.close()
    assert os.environ.get("SY_NATS_NKEY_EDGE") is None  # the server's env stays its own


@pytest.mark.parametrize("servers", [3], indirect=True)
async def test_only_the_route_certificate_opens_a_route(
    servers: list[EmbeddedNats], secrets: LocalSecrets, tmp_path: Path
) -> None:
    """A fourth server dialing the cluster with a certificate of the same CA that is not
    the route certificate (a service's, CN=edge) is refused: `verify_and_map`."""
    first = servers[0]
    assert first.membership is not None
    impostor_cert = secrets.ca.issue("edge", server=True, client=True, stem="impostor")
    route_tls = tls_block(
        impostor_cert.cert, impostor_cert.key, secrets.ca.cert, verify="verify_and_map", indent=4
    )
    member = ClusterMembership(
        "impostor", first.membership.cluster, free_port(), first.membership.routes,
        route_tls + '    authorization { user: "CN=edge" }\n',
    )  # fmt: skip
    with EmbeddedNats(tmp_path / "impostor", membership=member, monitor_port=free_port()) as bad:
        refused = "Route Error 'Authorization Violation'"  # what the members answer it
        for _ in range(100):
            if refused in (bad.data_dir / "nats.log").read_text():
                break
            await asyncio.sleep(0.1)
        assert refused in (bad.data_dir / "nats.log").read_text()
        assert bad.monitor("/routez").get("num_routes", 0) == 0
    names = {r["remote_name"] for r in first.monitor("/routez")["routes"]}
    assert "impostor" not in names


@pytest.mark.parametrize("servers", [1], indirect=True)
async def test_the_edge_serves_https_with_the_local_certificate(
    servers: list[EmbeddedNats], secrets: LocalSecrets, tmp_path: Path
) -> None:
    """`sy up --secure`'s edge, as it starts it (`plan`, `secure`, `roster`): HTTPS with the
    server certificate, ready when `/readyz` answers over TLS trusting the local CA; plain
    HTTP gets no answer."""
    url = servers[0].url
    admin = await connect(Settings(nats_url=url, **secrets.client_settings(ADMIN_USER)), "admin")
    try:
        await provision(TopologySettings(nats_url=url), js=admin.js)
    finally:
        await admin.close()
    port = free_port()
    procs, _ = plan(FLEET, workers=1, engine="sim", edge_port=port)
    (edge,) = [p for p in secure(procs, secrets) if p.kind == "edge"]
    ready = roster([edge], secrets.ca.cert)
    assert ready.edge_url == f"https://127.0.0.1:{port}"
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys: {}\n")
    env = {**edge.env, "SY_NATS_URL": url, "SY_API_KEYS_FILE": str(keys)}
    with ProcessGroup(tmp_path / "logs", grace=10) as group:
        child = group.start("edge", (sys.executable, "-m", edge.module), env)
        await asyncio.to_thread(
            wait_http, f"{ready.edge_url}/healthz", timeout=60, check=child.check,
            cafile=ready.edge_ca,
        )  # fmt: skip
        # Up over HTTPS, and on NATS over TLS as itself (no worker runs: not ready yet).
        tls = ssl.create_default_context(cafile=str(ready.edge_ca))
        async with httpx.AsyncClient(verify=tls) as http:
            checks = (await http.get(f"{ready.edge_url}/readyz")).json()
        assert checks["nats"] is True and checks["streams"] is True, checks
        with pytest.raises(NotReady):  # plain HTTP on the HTTPS port
            await asyncio.to_thread(wait_http, f"http://127.0.0.1:{port}/healthz", timeout=2)
        with pytest.raises(NotReady):  # HTTPS without trusting the local CA
            await asyncio.to_thread(wait_http, f"{ready.edge_url}/healthz", timeout=2)
