"""Auditor settings: `SY_MYSQL_HOST`, `SY_SQL_AUDIT_PASSWORD`, `SY_SQL_AUDIT_DB`,
`SY_AUDIT_BATCH`, ... The auditor holds only the INSERT-only audit account: in production
give it `SY_SQL_AUDIT_PASSWORD`, never `SY_SQL_DB_SECRET` (see `sqldb.settings`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr, model_validator

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
    # The auditor needs no SY_SQL_DB_SECRET when it has SY_SQL_AUDIT_PASSWORD, and should
    # not hold it: every tenant account's password derives from it.
    sql_db_secret: SecretStr | None = None

    @model_validator(mode="after")
    def _has_a_password(self) -> AuditorSettings:
        if self.sql_audit_password is None and self.sql_db_secret is None:
            if self.env != "local":
                raise ValueError("set SY_SQL_AUDIT_PASSWORD (the audit account's password)")
            # Local development: derive it like `sy sql provision` does, from the default.
            self.sql_db_secret = DatabaseSettings.model_fields["sql_db_secret"].default
        return self
