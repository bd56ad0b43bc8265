"""The NATS a fleet runs on, and the topology provisioned on it before any service starts."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Collection, Iterator
from pathlib import Path
from urllib.parse import urlparse

from nats.js import JetStreamContext

from switchyard.bus.connection import connect
from switchyard.bus.provision import Change
from switchyard.bus.provision import provision as provision_topology
from switchyard.bus.topology import Topology, TopologySettings, build_topology
from switchyard.fleet.errors import FleetError
from switchyard.natsserver import EmbeddedNats
from switchyard.ports import reachable


def host_port(url: str) -> tuple[str, int]:
    """Host and port of `url`, or of the first server of a comma-separated cluster list."""
    parsed = urlparse(url.split(",")[0].strip())
    return parsed.hostname or "127.0.0.1", parsed.port or 4222


def any_reachable(url: str) -> bool:
    """Whether any server of `url` (one, or a comma-separated cluster list) answers."""
    return any(reachable(*host_port(one)) for one in url.split(",") if one.strip())


@contextlib.contextmanager
def nats_server(url: str | None = None) -> Iterator[str]:
    """`url` when it answers; with no URL, a throwaway embedded server for the block, in a
    session of its own: a terminal's Ctrl-C reaches the launcher, which stops the
    services first and this server last (they drain instead of losing their bus)."""
    if url:
        if not any_reachable(url):
            raise FleetError(f"NATS at {url} is not reachable")
        yield url
        return
    with (
        tempfile.TemporaryDirectory(prefix="sy-nats-") as tmp,
        EmbeddedNats(Path(tmp), new_session=True) as server,
    ):
        yield server.url


async def _quiet() -> None:
    """Closing our own short connection is not worth a warning."""


async def provision(
    settings: TopologySettings, *, streams: Collection[str] | None = None,
    js: JetStreamContext | None = None,
) -> list[Change]:  # fmt: skip
    """Create or verify the streams, consumers and KV buckets `settings` describe.

    `streams`: only those streams, without consumers or buckets (a lone executor needs
    just AUDIT). On `js` when given, else on a short connection of its own, as the
    settings' NATS user.
    """
    topology = build_topology(settings)
    if streams is not None:
        topology = Topology(tuple(s for s in topology.streams if s.name in streams), (), ())
    if js is not None:
        return await provision_topology(js, topology)
    async with await asyncio.wait_for(
        connect(settings, "sy-provision", disconnected_cb=_quiet), 30
    ) as bus:
        return await provision_topology(bus.js, topology)
