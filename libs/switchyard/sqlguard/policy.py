"""A tenant's SQL policy: which views and columns it may read, and the limits on a statement.

Loaded from YAML, e.g.

    dialect: mysql
    max_limit: 1000
    database: t_acme            # optional: where unqualified table names resolve
    tables:
      t_acme.players: "*"
      t_acme.daily_activity: [day, server_id, dau]

A column list may leave out columns the view has; those stay unreadable, and
unqualified names and `*` are judged accordingly (see `exact_columns`).
Unknown keys are refused, so a misspelt option fails at load time instead of
silently loosening the policy. The version signed into every verdict is the
`version` key when given, else a hash of the normalised content: any edit of
the file changes it and invalidates earlier signatures.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from switchyard.sqlguard.rules import RULESET_VERSION

# MySQL object names (unquoted-safe subset): the policy is written by operators and
# by `sy sql provision`; anything exotic there is more likely a mistake than a need.
_NAME = r"[A-Za-z0-9_$]{1,64}"
TableName = Annotated[str, StringConstraints(pattern=rf"^{_NAME}\.{_NAME}$")]
ColumnName = Annotated[str, StringConstraints(pattern=rf"^{_NAME}$")]
SchemaName = Annotated[str, StringConstraints(pattern=rf"^{_NAME}$")]

_TENANT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")

# Never reachable, whatever a policy says.
SYSTEM_SCHEMAS = frozenset({"information_schema", "mysql", "performance_schema", "sys"})


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,64}$")] | None = None
    dialect: Literal["mysql"] = "mysql"
    database: SchemaName | None = None
    max_limit: int = Field(default=1000, ge=1, le=100_000)
    on_missing_limit: Literal["inject", "reject"] = "inject"
    on_oversized_limit: Literal["clamp", "reject"] = "clamp"
    max_length: int = Field(default=16 * 1024, ge=16, le=64 * 1024)
    max_tokens: int = Field(default=4096, ge=8, le=65_536)
    max_parens: int = Field(default=32, ge=1, le=256)
    max_depth: int = Field(default=64, ge=4, le=256)
    allow_recursive_cte: bool = False
    # True when each column list is the view's complete column set (what `sy sql
    # provision` writes): an unqualified name can then only reach listed columns,
    # and a name no listed table has is refused before it reaches the database.
    exact_columns: bool = False
    tables: dict[TableName, Literal["*"] | list[ColumnName]] = {}

    @field_validator("tables")
    @classmethod
    def _no_system_schemas(
        cls, value: dict[str, Literal["*"] | list[str]]
    ) -> dict[str, Literal["*"] | list[str]]:
        for name in value:
            if name.split(".", 1)[0].lower() in SYSTEM_SCHEMAS:
                raise ValueError(f"{name}: system schemas can never be allowed")
        return value

    # Plain properties, not cached: `model_copy(update=...)` would carry a stale cache.
    @property
    def policy_version(self) -> str:
        if self.version:
            return self.version
        body = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return f"{RULESET_VERSION}-{hashlib.sha256(body).hexdigest()[:16]}"

    @property
    def allowed(self) -> dict[tuple[str, str], AllowedTable]:
        """(schema, table) lowercased -> its spelling and allowed columns (None = all)."""
        out: dict[tuple[str, str], AllowedTable] = {}
        for name, cols in self.tables.items():
            schema, table = name.split(".", 1)
            out[(schema.lower(), table.lower())] = AllowedTable(
                schema, table, None if cols == "*" else frozenset(c.lower() for c in cols)
            )
        return out


@dataclass(frozen=True)
class AllowedTable:
    schema: str
    table: str
    columns: frozenset[str] | None  # None: every column of the view

    def allows(self, column: str) -> bool:
        return self.columns is None or column.lower() in self.columns


def load_policy(path: Path) -> Policy:
    """Read a policy file; `ValueError` with the reason when it is unusable."""
    try:
        data: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read policy {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"policy {path} must be a YAML mapping")
    return Policy.model_validate(data)


def dump_policy(policy: Policy) -> str:
    return yaml.safe_dump(policy.model_dump(mode="json", exclude_none=True), sort_keys=False)


class PolicyStore:
    """Per-tenant policies from `<dir>/<tenant>.yaml`, re-read when a file changes.

    Both the validator and the executor read the same directory: the executor
    re-validates with the policy it holds and refuses a signature made under
    another version, so an edited policy takes effect on both sides at once.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._cache: dict[str, tuple[int, int, Policy, str]] = {}
        self._lock = threading.Lock()

    def get(self, tenant: str) -> Policy | None:
        found = self.get_with_digest(tenant)
        return found[0] if found else None

    def get_with_digest(self, tenant: str) -> tuple[Policy, str] | None:
        """The policy and a digest of its content (a cache key that changes with any edit)."""
        if not _TENANT.match(tenant):  # a tenant id becomes a file name: no paths
            return None
        path = self.directory / f"{tenant}.yaml"
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        with self._lock:
            cached = self._cache.get(tenant)
            if cached and cached[0] == st.st_mtime_ns and cached[1] == st.st_size:
                return cached[2], cached[3]
        policy = load_policy(path)
        digest = hashlib.sha256(dump_policy(policy).encode()).hexdigest()
        with self._lock:
            self._cache[tenant] = (st.st_mtime_ns, st.st_size, policy, digest)
        return policy, digest
