"""Secrets never reach the audit table; result rows have nowhere to go."""

from __future__ import annotations

import pytest

from services.auditor.redact import MASK, ROWS_OMITTED, redact, redact_text
from services.auditor.store import kind_of, to_row
from switchyard.messages.sql import AuditEvent


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("my key is sk-abcdefghijklmnop1234 please", "sk-abcdefghijklmnop1234"),
        ("use sk-ant-api03-XYZxyz0123456789_-abc", "sk-ant-api03-XYZxyz0123456789_-abc"),
        ("mysql://app:hunter2@db.internal:3306/x", "hunter2"),
        ("postgresql://u:p%40ss@h/db and more", "p%40ss"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc.def", "eyJhbGciOiJIUzI1NiJ9"),
        ("connect with password=s3cret!x and go", "s3cret!x"),
        ("PASSWORD: 'quoted secret'", "quoted secret"),
        ('{"api_key": "abc123def456"}', "abc123def456"),
        ("token=tok_123456789", "tok_123456789"),
        ("CREATE USER x IDENTIFIED BY 'pw123'", "pw123"),
        ("mysql://app:p@ss@db:3306/x", "p@ss"),
        (
            "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NSJ9.c2lnbmF0dXJl pasted",
            "eyJzdWIiOiIxMjM0NSJ9",
        ),
        ("my github token ghp_abcdefghijklmnopqrstuvwxyz0123", "ghp_abcdefghijklmnop"),
        ("slack xoxb-1234567890-abcdefghij", "xoxb-1234567890"),
        ("aws AKIAIOSFODNN7EXAMPLE key", "AKIAIOSFODNN7EXAMPLE"),
        ("the edge key sk-local-acme works", "sk-local-acme"),
    ],
)
def test_secrets_are_redacted(text: str, secret: str) -> None:
    out = redact_text(text)
    assert secret not in out
    assert MASK in out


def test_harmless_text_is_untouched() -> None:
    text = "SELECT player_id, SUM(amount) FROM payments WHERE day >= '2025-01-01' GROUP BY 1"
    assert redact_text(text) == text
    assert redact_text("how many passwords were reset last week?") == (
        "how many passwords were reset last week?"
    )


def test_nested_values_and_secret_keys() -> None:
    value = {
        "password": "plain",
        "dsn": "whatever",
        "note": ["ok", {"inner": "Bearer abcdefghijkl"}],
        "count": 3,
        "rows": [[1, 2]],
    }
    out = redact(value)
    assert out["password"] == MASK and out["dsn"] == MASK
    assert out["note"][1]["inner"] == f"Bearer {MASK}"
    assert out["count"] == 3
    assert out["rows"] == ROWS_OMITTED


def test_result_rows_are_omitted_but_plan_row_estimates_kept() -> None:
    # An EXPLAIN plan's `rows` is an estimate worth auditing; result rows never are.
    plan = [{"table": "dau", "type": "ref", "rows": 1234}, {"table": "pay", "rows": None}]
    assert redact(plan) == plan
    leaked = {"result": [{"player": "alice", "spend": 9}], "results": "alice,9", "rows": True}
    assert redact(leaked) == {k: ROWS_OMITTED for k in leaked}
    event = AuditEvent(
        tenant="acme", request_id="r1", event="execute", actor="executor", verdict="ok",
        plan=plan, detail={"rows": [[1, "alice"]], "rows_estimated": 1234},
    )  # fmt: skip
    row = to_row(event, "sql")
    assert row.record["plan"] == plan
    assert row.record["detail"] == {"rows": ROWS_OMITTED, "rows_estimated": 1234}
    assert "alice" not in row.body


def test_event_model_has_no_rows_and_row_is_redacted() -> None:
    assert "rows" not in AuditEvent.model_fields
    event = AuditEvent(
        tenant="acme", request_id="r1", event="execute", actor="executor", verdict="ok",
        question="my key sk-secretsecretsecret, what is DAU?",
        sql="SELECT 1 -- mysql://root:toor@db", detail={"token": "t0k", "client": "x"},
    )  # fmt: skip
    row = to_row(event, kind_of("audit.sql.acme"))
    assert "secretsecret" not in row.body and "toor" not in row.body and "t0k" not in row.body
    assert row.record["kind"] == "sql"
    assert row.record["detail"] == {"token": MASK, "client": "x"}


def test_kind_of_subject() -> None:
    assert kind_of("audit.sql.acme") == "sql"
    assert kind_of("x1.audit.agent.nova") == "agent"
    assert kind_of("audit") == "unknown"
