"""HMAC-SHA256 over (tenant, database, canonical SQL, policy version).

The validator signs what it approved; the executor runs nothing whose
signature does not verify under its own copy of the key. The fields are
length-prefixed, so no two different tuples share a message (`"ab" + "c"`
cannot pass for `"a" + "bc"`), and a domain tag keeps these MACs from being
replayed as any other use of the same key.
"""

from __future__ import annotations

import hashlib
import hmac

_DOMAIN = b"switchyard.sql.v1"


def _message(tenant: str, database: str, sql: str, policy_version: str) -> bytes:
    parts = [_DOMAIN]
    for field in (tenant, database, sql, policy_version):
        data = field.encode("utf-8")
        parts.append(len(data).to_bytes(4, "big") + data)
    return b"".join(parts)


def sign(key: bytes, *, tenant: str, database: str, sql: str, policy_version: str) -> str:
    if len(key) < 16:
        raise ValueError("the SQL signing key must be at least 16 bytes")
    return hmac.new(
        key, _message(tenant, database, sql, policy_version), hashlib.sha256
    ).hexdigest()


def verify(
    key: bytes,
    signature: str | None,
    *,
    tenant: str,
    database: str,
    sql: str,
    policy_version: str,
) -> bool:
    if not signature:
        return False
    expected = sign(key, tenant=tenant, database=database, sql=sql, policy_version=policy_version)
    return hmac.compare_digest(expected, signature.lower())


def sql_hash(sql: str) -> str:
    """The id of a statement in audit events (not a secret, not a MAC)."""
    return hashlib.sha256(sql.encode("utf-8")).hexdigest()
