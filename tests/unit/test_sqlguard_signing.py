"""The HMAC over (tenant, database, canonical SQL, policy version): round trip and tampering."""

from __future__ import annotations

import hashlib
import hmac
import re

import pytest

from switchyard.sqlguard.signing import sign, sql_hash, verify

KEY = b"k" * 32
FIELDS = {
    "tenant": "acme",
    "database": "t_acme",
    "sql": "SELECT 1 LIMIT 10",
    "policy_version": "v1",
}


def test_round_trip() -> None:
    signature = sign(KEY, **FIELDS)
    assert re.fullmatch("[0-9a-f]{64}", signature)
    # Known answer: HMAC-SHA256 over the domain tag and each field, 4-byte length first.
    message = b"switchyard.sql.v1" + b"".join(
        len(v.encode()).to_bytes(4, "big") + v.encode() for v in FIELDS.values()
    )
    assert signature == hmac.new(KEY, message, hashlib.sha256).hexdigest()
    assert verify(KEY, signature, **FIELDS)
    assert verify(KEY, signature.upper(), **FIELDS)
    assert sign(KEY, **FIELDS) == signature  # deterministic


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tenant", "nova"),  # signed for another tenant
        ("database", "t_nova"),
        ("sql", "SELECT 1 LIMIT 100"),  # altered after signing
        ("sql", "SELECT 1 LIMIT 10 "),
        ("policy_version", "v2"),
    ],
)
def test_any_changed_field_fails(field: str, value: str) -> None:
    signature = sign(KEY, **FIELDS)
    assert not verify(KEY, signature, **{**FIELDS, field: value})


def test_fields_cannot_slide_into_each_other() -> None:
    a = sign(KEY, tenant="ab", database="c", sql="x", policy_version="v")
    b = sign(KEY, tenant="a", database="bc", sql="x", policy_version="v")
    assert a != b


def test_wrong_key_flipped_bit_and_missing_signature() -> None:
    signature = sign(KEY, **FIELDS)
    assert not verify(b"j" * 32, signature, **FIELDS)
    flipped = ("0" if signature[0] != "0" else "1") + signature[1:]
    assert not verify(KEY, flipped, **FIELDS)
    assert not verify(KEY, None, **FIELDS)
    assert not verify(KEY, "", **FIELDS)
    assert not verify(KEY, "zz", **FIELDS)


def test_short_keys_are_refused() -> None:
    with pytest.raises(ValueError):
        sign(b"short", **FIELDS)


def test_sql_hash_is_sha256_hex() -> None:
    assert sql_hash("SELECT 1") == (
        "e004ebd5b5532a4b85984a62f8ad48a81aa3460c1ca07701f386135d72cdecf5"
    )
