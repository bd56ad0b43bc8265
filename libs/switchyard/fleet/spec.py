"""What a fleet is made of, as data: pools of workers, the other services, their settings.

A service is configured by its `SY_*` environment alone, as `python -m services.<name>`
and in process alike (the in-process launcher builds its settings from the same
variables), so one description serves both launch modes, and `sy up --dry-run` prints
exactly what runs.

Two levels: `FleetSpec` says what is wanted (pools, workers per pool, engine, which
services, the edge, a tenant policy, extra settings); `FleetSpec.roster(workdir)`
expands it into a `Roster`, the services to start in order and what "ready" means for
them. `sy up` builds its roster itself from its own service table; benchmarks and tests
write a `FleetSpec`.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from switchyard.apikeys import hash_key
from switchyard.fleet.readiness import PoolReady
from switchyard.messages.fleet import WorkerRole
from switchyard.ports import free_port

Engine = Literal["llamacpp", "sim", "vllm"]

# The services besides the workers and the edge, in start order: consumers before the
# services that produce their input, so nothing is published before it has a reader.
SERVICES = ("auditor", "executor", "validator", "router", "sqlflow", "preprocessor")
TEXT2SQL = ("auditor", "executor", "validator", "sqlflow")

# A tenant policy that never limits: a benchmark measures the fleet, not the quotas.
UNMETERED: dict[str, Any] = {
    "default": {"itpm": 10**12, "otpm": 10**12, "max_concurrency": 10**6,
                "max_queued_tokens": 10**12},
}  # fmt: skip


def env_of(**settings: Any) -> dict[str, str]:
    """Settings fields as the `SY_*` variables a service reads them from: lists and maps
    as JSON (what pydantic-settings parses), booleans in lower case, the rest as text."""

    def text(value: Any) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, list | tuple | dict):
            return json.dumps(value)
        return str(value)

    return {f"SY_{name.upper()}": text(value) for name, value in settings.items()}


@dataclass(frozen=True)
class Service:
    """One service instance: `python -m <module>` with `env` laid over the launcher's."""

    name: str  # unique in its fleet: the log prefix, the log file's name
    module: str  # `services.<kind>`
    env: Mapping[str, str] = field(default_factory=dict)
    nats_user: str = ""  # its user in compose/nats-auth.conf, for a fleet with NATS users

    @property
    def kind(self) -> str:
        return self.module.rpartition(".")[2]

    @property
    def argv(self) -> tuple[str, ...]:
        return (sys.executable, "-m", self.module)

    def describe(self) -> str:
        shown = {k: ("***" if "PASSWORD" in k else v) for k, v in self.env.items()}
        return f"python -m {self.module}" + "".join(f" {k}={v}" for k, v in shown.items())


@dataclass(frozen=True)
class Roster:
    """The services to start, in this order, and what "ready" means for them."""

    services: tuple[Service, ...]
    pools: tuple[PoolReady, ...] = ()
    partitions: int = 64  # per pool, fleet-wide (`SY_PARTITIONS`)
    edge_url: str | None = None  # waited on at `<edge_url>/readyz`
    edge_ca: Path | None = None  # the CA an HTTPS edge's certificate chains to


_ROLE_LETTERS: dict[str, WorkerRole] = {"p": "prefill", "d": "decode", "b": "both"}
_SPLIT_RE = re.compile(r"(?:[1-9][0-9]*[pdb])+")


def role_split(split: str) -> tuple[WorkerRole, ...]:
    """Worker roles from a split such as `5p3d` (5 prefill, then 3 decode workers; `b` is
    `both`), in that order. ValueError for anything else."""
    text = split.strip().lower()
    if not _SPLIT_RE.fullmatch(text):
        raise ValueError(f"a role split is counts of p, d or b, as in 5p3d; got {split!r}")
    return tuple(
        _ROLE_LETTERS[letter]
        for count, letter in re.findall(r"([0-9]+)([pdb])", text)
        for _ in range(int(count))
    )


@dataclass(frozen=True)
class Pool:
    """`workers` worker replicas serving pool `name`, with ids `<name>-w<i>`; `roles`, one
    per worker in order (`role_split`), disaggregates the pool (#39); empty: all `both`."""

    name: str
    workers: int = 1
    env: Mapping[str, str] = field(default_factory=dict)  # e.g. the engine's SY_SIM_*
    roles: tuple[WorkerRole, ...] = ()

    def __post_init__(self) -> None:
        if self.roles and len(self.roles) != self.workers:
            named = f"{len(self.roles)} roles for {self.workers} workers"
            raise ValueError(f"pool {self.name}: {named}")

    def worker_ids(self) -> tuple[str, ...]:
        return tuple(f"{self.name}-w{i}" for i in range(self.workers))

    def role(self, i: int) -> WorkerRole:
        return self.roles[i] if self.roles else "both"


@dataclass(frozen=True)
class Edge:
    """The HTTP edge: on `port` (0: a free one), with API keys from `keys_file` or `keys`
    (plain key -> tenant, written hashed to a keys file of the run)."""

    port: int = 0
    keys: Mapping[str, str] = field(default_factory=dict)
    keys_file: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetSpec:
    """A fleet as wanted. Without a router the workers own every partition (static)."""

    pools: tuple[Pool, ...] = (Pool("llm"),)
    engine: Engine = "sim"
    partitions: int = 64
    services: tuple[str, ...] = ("router", "preprocessor")  # any of SERVICES
    edge: Edge | None = None
    tenant_policy: Mapping[str, Any] | Path | None = None  # YAML content, or its file
    env: Mapping[str, str] = field(default_factory=dict)  # for every service
    service_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # by kind
    # Fast beats and rebalances: readiness is seen within half a second of being true.
    heartbeat_interval: float = 0.5
    rebalance_interval: float = 0.5

    @property
    def routed(self) -> bool:
        return "router" in self.services

    def roster(self, workdir: Path) -> Roster:
        """The services in start order; files they read (policy, keys) go to `workdir`."""
        unknown = sorted(set(self.services) - set(SERVICES))
        if unknown:
            raise ValueError(f"unknown services {unknown}; choose from {', '.join(SERVICES)}")
        common = {**self.env, "SY_PARTITIONS": str(self.partitions)}
        services: list[Service] = []
        for kind in SERVICES:
            if kind == "router":  # the workers before the router that assigns them
                services += self._workers(common)
            if kind in self.services:
                own = self._router(workdir) if kind == "router" else {}
                services.append(self._service(kind, kind, {**common, **own}))
        edge_url = None
        if self.edge is not None:
            port = self.edge.port or free_port()
            keys = self._keys(workdir, self.edge)
            env = {**common, "SY_PORT": str(port), "SY_API_KEYS_FILE": str(keys), **self.edge.env}
            services.append(self._service("edge", "edge", env))
            edge_url = f"http://127.0.0.1:{port}"
        ready = tuple(
            PoolReady(p.name, p.workers, self.partitions, self.routed, p.worker_ids())
            for p in self.pools
        )
        return Roster(tuple(services), ready, self.partitions, edge_url)

    def _workers(self, common: Mapping[str, str]) -> list[Service]:
        workers = []
        for pool in self.pools:
            for i, worker in enumerate(pool.worker_ids()):
                env = {
                    **common, "SY_POOL": pool.name, "SY_ENGINE": self.engine,
                    "SY_WORKER_ID": worker, "SY_WORKER_ROLE": pool.role(i),
                    "SY_ASSIGNMENT": "kv" if self.routed else "static",
                    "SY_HEARTBEAT_INTERVAL": str(self.heartbeat_interval), **pool.env,
                }  # fmt: skip
                workers.append(self._service("worker", worker, env))
        return workers

    def _service(self, kind: str, name: str, env: Mapping[str, str]) -> Service:
        return Service(name, f"services.{kind}", {**env, **self.service_env.get(kind, {})})

    def _router(self, workdir: Path) -> dict[str, str]:
        env = {"SY_POOLS": json.dumps([p.name for p in self.pools]),
               "SY_REBALANCE_INTERVAL": str(self.rebalance_interval)}  # fmt: skip
        policy = self.tenant_policy
        if isinstance(policy, Mapping):
            path = workdir / "tenants.yaml"
            path.write_text(yaml.safe_dump(dict(policy)))
            policy = path
        if policy is not None:
            env["SY_TENANT_POLICY"] = str(policy)
        return env

    @staticmethod
    def _keys(workdir: Path, edge: Edge) -> Path:
        if edge.keys_file is not None:
            return edge.keys_file
        path = workdir / "keys.yaml"
        keys = {hash_key(key): {"tenant": tenant} for key, tenant in edge.keys.items()}
        path.write_text(yaml.safe_dump({"keys": keys}))
        return path
