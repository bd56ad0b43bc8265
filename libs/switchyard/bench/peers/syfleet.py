"""A Switchyard fleet as processes for the peers benchmark: NATS, router, sim workers,
and optionally the HTTP edge (whose chat needs no preprocessor).

The same services `sy up` runs (`python -m services.<name>`), each its own process like the
peers' routers and backends, on a private pool and an embedded `nats-server`, with an
unmetered tenant policy (the benchmark measures routing, not quotas) that every tenant of
the workloads falls under (`bench` for the agent and the overhead run, `t0`, `t1`, ... for
chat). With `tls`, NATS speaks TLS with client certificates as in production (a throwaway
CA; one client certificate for every process: the benchmark prices the encryption, not
the identities), to measure what TLS costs on the NATS path.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from switchyard.bus.connection import Bus, connect
from switchyard.fleet import UNMETERED, Edge, FleetSpec, Pool, env_of, launch
from switchyard.natsserver import EmbeddedNats, tls_block
from switchyard.pki import LocalCA

POOL = "peers"
TENANT = "bench"
KEY = "sk-bench-peers"  # a throwaway key for this run's private edge
PARTITIONS = 64


@dataclass(frozen=True)
class SwitchyardFleet:
    nats_url: str
    bus: Bus
    edge_url: str | None
    workers: list[str]


@contextlib.asynccontextmanager
async def switchyard_fleet(
    log_dir: Path, *, workers: int, delay_scale: float, edge: bool,
    routing_policy: str = "switchyard", tls: bool = False, env: Mapping[str, str] | None = None,
) -> AsyncIterator[SwitchyardFleet]:  # fmt: skip
    """The fleet, ready (every partition bound; the edge answering), its logs in `log_dir`;
    its router placing requests by `routing_policy` (`SY_ROUTING_POLICY`); NATS over TLS
    with `tls`; `env` for every service besides."""
    pool = Pool(POOL, workers, env_of(sim_delay_scale=delay_scale))
    with contextlib.ExitStack() as stack:
        nats_url: str | None = None  # launch's own embedded server, in the clear
        identity: dict[str, Path] = {}
        if tls:
            nats_url, identity = stack.enter_context(_tls_nats(log_dir / "nats-tls"))
        spec = FleetSpec(
            pools=(pool,), engine="sim", partitions=PARTITIONS,
            services=("router",),  # the edge prepares its chat itself
            tenant_policy=UNMETERED,
            env={**env_of(log_level="warning", chat_pool=POOL, **identity), **(env or {})},
            service_env={"router": env_of(routing_policy=routing_policy)},
            edge=Edge(keys={KEY: TENANT}, env=env_of(max_tokens_cap=4096)) if edge else None,
        )  # fmt: skip
        async with (
            launch(spec, nats_url=nats_url, nats_identity=identity, log_dir=log_dir) as fleet,
            await connect(fleet.client, "sy-bench-peers") as bus,
        ):
            yield SwitchyardFleet(fleet.nats_url, bus, fleet.edge_url, list(pool.worker_ids()))


@contextlib.contextmanager
def _tls_nats(directory: Path) -> Iterator[tuple[str, dict[str, Path]]]:
    """An embedded nats-server with TLS and client certificates; its URL and the Settings
    fields (CA, certificate, key) a client connects with."""
    ca = LocalCA.ensure(directory / "tls")
    server = ca.issue("server", server=True)
    client = ca.issue("bench", client=True)
    extra = tls_block(server.cert, server.key, ca.cert)
    with EmbeddedNats(directory, extra_config=extra) as nats:
        yield nats.url, {"nats_ca": ca.cert, "nats_cert": client.cert, "nats_key": client.key}
