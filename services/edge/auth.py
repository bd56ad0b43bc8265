"""Bearer API keys, stored only as SHA-256 hashes, mapped to a tenant and its grants.

The key file is YAML: `keys: {<sha256 hex>: {tenant: acme, models: [...], pools: [...]}}`
(plus `operator: true` for a key that may watch every tenant).
`models`/`pools` absent means every model/pool the edge serves. The tenant comes
from here and nowhere else: a body never chooses its tenant.
"""

from __future__ import annotations

import hmac
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from services.edge.errors import ApiError
from switchyard.apikeys import hash_key
from switchyard.envelope import TenantId


class Principal(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: TenantId
    models: list[str] | None = None
    pools: list[str] | None = None
    # An operator's key also sees every tenant's usage on the console's fleet page;
    # it still asks questions as its own tenant only.
    operator: bool = False

    def may_use_model(self, model: str) -> bool:
        return self.models is None or model in self.models

    def may_use_pool(self, pool: str) -> bool:
        return self.pools is None or pool in self.pools


class KeyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: dict[str, Principal] = Field(default_factory=dict)


class KeyRing:
    def __init__(self, keys: dict[str, Principal]) -> None:
        self._keys = {h.lower(): p for h, p in keys.items()}

    @classmethod
    def load(cls, path: Path | None) -> KeyRing:
        if path is None:
            return cls({})
        return cls(KeyFile.model_validate(yaml.safe_load(path.read_text()) or {}).keys)

    def authenticate(self, authorization: str | None) -> Principal:
        if not authorization or not authorization.lower().startswith("bearer "):
            raise ApiError(
                401, "missing Bearer API key", "invalid_request_error", "invalid_api_key"
            )
        digest = hash_key(authorization[7:].strip())
        # Constant-time compare against every entry: no timing hint about near misses.
        found = None
        for known, principal in self._keys.items():
            if hmac.compare_digest(known, digest):
                found = principal
        if found is None:
            raise ApiError(401, "invalid API key", "invalid_request_error", "invalid_api_key")
        return found
