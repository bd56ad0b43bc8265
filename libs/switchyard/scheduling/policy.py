"""Tenant policies: the quotas and priorities each tenant is admitted under.

A YAML file (`SY_TENANT_POLICY`):

    default:            # optional: applies to tenants not listed; absent = unknown tenants refused
      itpm: 200000
      otpm: 20000
    tenants:
      acme: {itpm: 1000000, otpm: 100000, max_concurrency: 64, weight: 2, priority: [0, 5]}
      acme-eu: {cache_group: acme}   # shares acme's cached prompt prefixes (default: none)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from switchyard.envelope import TenantId, Token
from switchyard.errors import SwitchyardError


class TenantPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    itpm: int = Field(default=1_000_000, ge=1, description="input (prompt) tokens per minute")
    otpm: int = Field(default=200_000, ge=1, description="output tokens per minute (reserved)")
    max_concurrency: int = Field(default=256, ge=1, description="queued + running requests")
    max_queued_tokens: int = Field(default=2_000_000, ge=1, description="prompt + max_tokens")
    priority: Annotated[tuple[int, int], Field(description="allowed [min, max] priority")] = (0, 9)
    weight: float = Field(default=1.0, gt=0, description="share of service under contention")
    # Tenants naming the same group share KV-cache prefixes (their `cache_salt`); by
    # default each tenant is its own group, so no tenant can time another's prompts.
    cache_group: Token | None = Field(default=None, description="share KV prefixes with")

    @model_validator(mode="after")
    def _priority_range(self) -> TenantPolicy:
        low, high = self.priority
        if not 0 <= low <= high <= 9:
            raise ValueError("priority must be [min, max] with 0 <= min <= max <= 9")
        return self


class Policies(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    default: TenantPolicy | None = None
    tenants: dict[TenantId, TenantPolicy] = {}

    def for_tenant(self, tenant: str) -> TenantPolicy | None:
        return self.tenants.get(tenant, self.default)

    def cache_salt(self, tenant: str) -> str:
        """The `cache_salt` every request of `tenant` carries: its group's, else its own."""
        policy = self.for_tenant(tenant)
        group = policy.cache_group if policy is not None else None
        return group or tenant

    @classmethod
    def load(cls, path: Path) -> Policies:
        try:
            raw = yaml.safe_load(path.read_text()) or {}
            return cls.model_validate(raw)
        except (OSError, yaml.YAMLError, ValidationError) as exc:
            raise SwitchyardError(f"tenant policy {path}: {exc}", code="invalid_request") from exc
