"""Validator settings: the signing key and the policy directory, plus the shared `SY_*`.

No database settings on purpose: the validator never talks to a database."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from switchyard.sqldb.settings import GuardSettings


class ValidatorSettings(GuardSettings):
    service_name: ClassVar[str] = "validator"
    # Requests validated at once (validation is CPU; this overlaps the audit publishes).
    validator_concurrency: int = Field(default=8, ge=1, le=1024)
    drain_timeout: float = Field(default=10.0, gt=0)
