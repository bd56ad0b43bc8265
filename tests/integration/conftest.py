"""Integration fixtures beyond the shared ones: a private SQL environment on MariaDB."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from switchyard.bus.connection import Bus
from switchyard.bus.provision import provision
from switchyard.bus.topology import Topology, TopologySettings, build_topology
from tests.support.sqlenv import SqlEnv, build, teardown


@pytest.fixture(scope="session")
def sqlenv(mysql_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlEnv]:
    env = build(mysql_dsn, tmp_path_factory.mktemp("sql-policies"))
    try:
        yield env
    finally:
        teardown(env)


@pytest.fixture
async def audit_stream(bus: Bus) -> None:
    """The AUDIT stream, for tests that read the audit trail the SQL services leave."""
    streams = tuple(s for s in build_topology(TopologySettings()).streams if s.name == "AUDIT")
    await provision(bus.js, Topology(streams, (), ()))
