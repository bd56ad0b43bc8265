"""The chain's hashing (the trigger computes the same in SQL) and `--since` parsing."""

from __future__ import annotations

import datetime as dt
import hashlib
import json

import pytest
import typer

from switchyard.cli.audit_commands import parse_since
from switchyard.sqldb.auditchain import GENESIS, _check_row, canonical, content_hash, link_hash


def test_canonical_is_stable_and_sorted() -> None:
    a = canonical({"b": 1, "a": "é", "c": None})
    assert a == '{"a":"é","b":1,"c":null}'
    assert canonical(json.loads(a)) == a


def test_link_hash_matches_the_trigger_formula() -> None:
    body_hash = content_hash("{}")
    assert body_hash == hashlib.sha256(b"{}").hexdigest()
    expected = hashlib.sha256(f"{GENESIS}:1:acme:{body_hash}".encode()).hexdigest()
    assert link_hash(GENESIS, 1, "acme", body_hash) == expected
    # every input matters
    assert link_hash(GENESIS, 2, "acme", body_hash) != expected
    assert link_hash(GENESIS, 1, "nova", body_hash) != expected
    assert link_hash("1" * 64, 1, "acme", body_hash) != expected


def _row(seq: int, prev: str, record: dict[str, object]) -> dict[str, object]:
    """The row as MariaDB hands it back: `at` a datetime, `plan`/`detail` JSON text."""
    body = canonical(record)
    ch = content_hash(body)
    row: dict[str, object] = {k: record.get(k) for k in record}
    row["at"] = dt.datetime.fromisoformat(str(record["at"]))
    row["plan"], row["detail"] = json.dumps(record["plan"]), json.dumps(record["detail"])
    row.update(
        seq=seq, prev_hash=prev, body=body, content_hash=ch,
        row_hash=link_hash(prev, seq, str(record["tenant"]), ch),
        killed=0, rows_scanned=None, rows_returned=None,
    )  # fmt: skip
    return row


RECORD: dict[str, object] = {
    "event_id": "e1", "request_id": "r1", "tenant": "acme", "kind": "sql", "event": "execute",
    "actor": "executor", "verdict": "ok", "rule": None, "sql_text": "SELECT 1", "question": "q",
    "killed": False, "rows_scanned": None, "rows_returned": None,
    "at": "2026-01-02T03:04:05.123456", "sql_hash": "ab" * 32, "trace": None,
    "duration_ms": 12.345, "plan": [{"table": "dau", "rows": 10}], "detail": {"db": "ops"},
}  # fmt: skip


def test_check_row_detects_each_kind_of_tampering() -> None:
    good = _row(1, GENESIS, RECORD)
    assert _check_row(good, GENESIS, 1) is None
    assert "gap" in (_check_row(good, GENESIS, 2) or "")
    assert "prev_hash" in (_check_row(good, "f" * 64, 1) or "")
    assert "question" in (_check_row({**good, "question": "edited"}, GENESIS, 1) or "")
    edited_body = str(good["body"]).replace('"SELECT 1"', '"SELECT 2"')
    assert "content_hash" in (_check_row({**good, "body": edited_body}, GENESIS, 1) or "")
    resealed = {**good, "body": edited_body, "content_hash": content_hash(edited_body)}
    assert "row_hash" in (_check_row(resealed, GENESIS, 1) or "")


@pytest.mark.parametrize(
    ("column", "forged"),
    [
        ("at", dt.datetime(2026, 1, 2, 3, 4, 6)),
        ("duration_ms", 0.5),
        ("sql_hash", "cd" * 32),
        ("trace", "00-forged-01"),
        ("plan", '[{"table": "dau", "rows": 1}]'),
        ("detail", '{"db": "pay"}'),
        ("detail", "not json"),
    ],
)
def test_check_row_covers_every_stored_column(column: str, forged: object) -> None:
    good = _row(1, GENESIS, RECORD)
    # JSON equality, not text equality: the server may re-space JSON it stores
    assert _check_row({**good, "plan": '[{"rows":10,"table":"dau"}]'}, GENESIS, 1) is None
    assert column in (_check_row({**good, column: forged}, GENESIS, 1) or "")


def test_parse_since() -> None:
    now = dt.datetime(2026, 1, 2, 12, 0, tzinfo=dt.UTC)
    assert parse_since("1h", now) == dt.datetime(2026, 1, 2, 11, 0)
    assert parse_since("30m", now) == dt.datetime(2026, 1, 2, 11, 30)
    assert parse_since("2d", now) == dt.datetime(2025, 12, 31, 12, 0)
    assert parse_since("2026-01-01T00:00:00", now) == dt.datetime(2026, 1, 1)
    with pytest.raises(typer.BadParameter):
        parse_since("yesterday", now)


def test_query_refuses_a_malformed_tenant_before_connecting() -> None:
    from typer.testing import CliRunner

    from switchyard.cli.app import app

    # the DSN points nowhere: the tenant must be refused before any connection
    result = CliRunner().invoke(
        app, ["audit", "query", "--tenant", "Acme; DROP", "--dsn", "mysql://root@127.0.0.1:1"]
    )
    assert result.exit_code == 2
    assert "not a valid tenant id" in result.output
