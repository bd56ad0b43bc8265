"""Executor settings: `SY_MYSQL_HOST`, `SY_SQL_DB_SECRET`, `SY_SQL_POOL_SIZE`, ... (see
`switchyard.sqldb.settings`). The only service with database credentials."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from switchyard.sqldb.settings import ExecutorConfig


class ExecutorSettings(ExecutorConfig):
    service_name: ClassVar[str] = "executor"
    drain_timeout: float = Field(default=30.0, gt=0)
