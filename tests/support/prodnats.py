"""The production NATS config of compose/ on real servers, in a temporary directory.

A throwaway CA (`switchyard.pki`) and one nkey per service (`switchyard.identity`)
stand in for a deployment's secrets; in the config only the addresses, the store and
the `/etc/nats/tls/` paths are rewritten, so what the tests prove is the shipped file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchyard.config import Settings
from switchyard.identity import Identity
from switchyard.natsserver import binary
from switchyard.pki import CertFiles, LocalCA

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
CONF = COMPOSE / "nats.conf"
AUTH = COMPOSE / "nats-auth.conf"
CLUSTER_CONF = COMPOSE / "nats-cluster.conf"
TLS_DIR = "/etc/nats/tls/"
ROUTE_CN = "switchyard-nats-route"
USERS = (
    "admin", "edge", "preprocessor", "router", "worker", "sqlflow", "validator", "executor",
    "auditor",
)  # fmt: skip


def rewrite(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the config no longer has exactly one {old!r}: update the test"
    return text.replace(old, new)


@dataclass
class FleetSecrets:
    """The CA (server, route and client certificates) and every service's nkey, under `dir`."""

    dir: Path
    ca: LocalCA = field(init=False)
    identities: dict[str, Identity] = field(init=False)
    clients: dict[str, CertFiles] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ca = LocalCA.ensure(self.dir / "tls")
        self.ca.issue("server", server=True)
        # The route certificate's common name is what the cluster's `verify_and_map` admits.
        self.ca.issue(ROUTE_CN, server=True, client=True, stem="route")
        self.identities = {u: Identity.ensure(self.dir / "nkeys", u) for u in USERS}

    def server_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for identity in self.identities.values():
            env |= identity.server_env()
        return env

    def client_cert(self, user: str) -> CertFiles:
        if user not in self.clients:
            self.clients[user] = self.ca.issue(user, client=True)
        return self.clients[user]

    def settings(self, url: str, user: str, **fields: Any) -> Settings:
        """`user`'s settings as a deployment gives them: its CA, certificate and nkey seed."""
        cert = self.client_cert(user)
        return Settings(
            nats_url=url, nats_user=user, nats_ca=self.ca.cert, nats_cert=cert.cert,
            nats_key=cert.key, nats_nkey_seed_file=self.identities[user].seed_file, **fields,
        )  # fmt: skip


def write_conf(directory: Path, secrets: FleetSecrets, port: int, monitor: int) -> Path:
    """compose/nats.conf and nats-auth.conf into `directory`, listening on `port`."""
    directory.mkdir(parents=True, exist_ok=True)
    text = CONF.read_text()
    text = rewrite(text, "listen: 0.0.0.0:4222", f"listen: 127.0.0.1:{port}")
    text = rewrite(text, "http: 0.0.0.0:8222", f"http: 127.0.0.1:{monitor}")
    text = rewrite(text, 'store_dir: "/data/jetstream"', f'store_dir: "{directory / "js"}"')
    text = rewrite(text, "max_file_store: 200GB", "max_file_store: 1GB")
    text = text.replace(TLS_DIR, f"{secrets.ca.directory}/")
    (directory / "nats.conf").write_text(text)
    shutil.copy(AUTH, directory / "nats-auth.conf")
    return directory / "nats.conf"


def write_cluster_conf(directory: Path, secrets: FleetSecrets, route_port: int) -> Path:
    """compose/nats-cluster.conf into `directory` (beside write_conf's nats.conf)."""
    text = rewrite(
        CLUSTER_CONF.read_text(), "listen: 0.0.0.0:6222", f"listen: 127.0.0.1:{route_port}"
    )
    text = text.replace(TLS_DIR, f"{secrets.ca.directory}/")
    (directory / "nats-cluster.conf").write_text(text)
    return directory / "nats-cluster.conf"


def check_conf(conf: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`nats-server -t` on `conf` with exactly `env` added to ours."""
    return subprocess.run(
        [str(binary()), "-t", "-c", str(conf)],
        env={**os.environ, **env}, capture_output=True, text=True, check=False,
    )  # fmt: skip
