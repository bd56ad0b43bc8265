"""Names and derived passwords of everything the SQL walls create.

All names come from settings prefixes plus a tenant id, so a test run can use a
private prefix and never touch another run's objects.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass

# MySQL 8 caps user names at 32 characters and schema names at 64.
MAX_USER = 32
MAX_SCHEMA = 64
_TENANT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def _fit(prefix: str, name: str, limit: int) -> str:
    full = prefix + name
    if len(full) <= limit:
        return full
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return prefix + name[: limit - len(prefix) - 9] + "_" + digest


def check_tenant(tenant: str) -> str:
    if not _TENANT.match(tenant):
        raise ValueError(f"tenant {tenant!r} is not a valid tenant id")
    return tenant


@dataclass(frozen=True)
class Naming:
    demo_prefix: str
    schema_prefix: str
    account_prefix: str
    secret: bytes

    @property
    def ops_db(self) -> str:
        return f"{self.demo_prefix}game_ops"

    @property
    def pay_db(self) -> str:
        return f"{self.demo_prefix}game_pay"

    def tenant_schema(self, tenant: str) -> str:
        # '-' is legal in a tenant id but needs quoting in SQL; '_' keeps names plain.
        return _fit(self.schema_prefix, check_tenant(tenant).replace("-", "_"), MAX_SCHEMA)

    def tenant_user(self, tenant: str) -> str:
        return _fit(self.account_prefix + "t_", check_tenant(tenant).replace("-", "_"), MAX_USER)

    @property
    def planner_user(self) -> str:
        return _fit(self.account_prefix, "planner", MAX_USER)

    @property
    def auditor_user(self) -> str:
        return _fit(self.account_prefix, "auditor", MAX_USER)

    def password(self, user: str) -> str:
        if len(self.secret) < 8:
            raise ValueError("SY_SQL_DB_SECRET must be at least 8 bytes")
        mac = hmac.new(self.secret, b"db-password\0" + user.encode(), hashlib.sha256).digest()
        # Mixed classes so a server-side password policy accepts it.
        return "Sy1-" + base64.urlsafe_b64encode(mac[:24]).decode().rstrip("=")
