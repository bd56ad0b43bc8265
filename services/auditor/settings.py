"""Auditor settings: `SY_MYSQL_HOST`, `SY_SQL_DB_SECRET`, `SY_SQL_AUDIT_DB`,
`SY_AUDIT_BATCH`, ... The auditor holds only the INSERT-only audit account."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from switchyard.sqldb.settings import DatabaseSettings


class AuditorSettings(DatabaseSettings):
    service_name: ClassVar[str] = "auditor"
    audit_stream: str = "AUDIT"
    audit_durable: str = "auditor"
    # Up to this many events are inserted in one transaction.
    audit_batch: int = Field(default=200, ge=1, le=1000)
    # Events held in flight = this many batches (keep the product <= the consumer's
    # max_ack_pending, 1000): with 2 the next batch is fetched and decoded while one is
    # written: 1.5-1.8x the events/s of 1 on a loaded 2-core box (tests.support.auditor_ab).
    audit_inflight_batches: int = Field(default=2, ge=1, le=4)
    # How long a partial batch waits for more events before it is written.
    audit_linger: float = Field(default=0.05, ge=0, le=5)
    audit_ack_wait: float = Field(default=30.0, gt=0)  # the consumer's, see bus.topology
    audit_max_deliver: int = Field(default=6, ge=2)
    drain_timeout: float = Field(default=30.0, gt=0)
