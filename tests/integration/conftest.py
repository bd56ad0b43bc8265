"""Integration fixtures beyond the shared ones: a private SQL environment on MariaDB."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.sqlenv import SqlEnv, build, teardown


@pytest.fixture(scope="session")
def sqlenv(mysql_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlEnv]:
    env = build(mysql_dsn, tmp_path_factory.mktemp("sql-policies"))
    try:
        yield env
    finally:
        teardown(env)
