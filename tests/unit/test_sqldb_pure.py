"""The pure parts of the database side: flavours, names, the EXPLAIN gate, cells."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from switchyard.sqldb.cells import to_cell
from switchyard.sqldb.explain import GateLimits, judge
from switchyard.sqldb.flavour import Flavour
from switchyard.sqldb.naming import MAX_USER, Naming
from switchyard.sqlguard import rules

MARIADB = Flavour.from_version("10.11.19-MariaDB-0+deb12u1")
MYSQL = Flavour.from_version("8.0.36")
LIMITS = GateLimits(max_rows=10_000, large_table_rows=5_000)


def test_flavour_detection_and_statement_limits() -> None:
    assert MARIADB.name == "mariadb" and MARIADB.version == (10, 11, 19)
    assert MYSQL.name == "mysql" and MYSQL.version == (8, 0, 36)
    assert MARIADB.timed("SELECT 1", 2.5) == "SET STATEMENT max_statement_time=2.500 FOR SELECT 1"
    assert MYSQL.timed("SELECT 1", 2.5) == "SELECT 1"  # MySQL: the session variable instead
    assert MARIADB.session_timeout(1.5) == "SET SESSION max_statement_time = 1.500"
    assert MYSQL.session_timeout(1.5) == "SET SESSION max_execution_time = 1500"
    assert "MAX_STATEMENT_TIME 3.000" in MARIADB.user_limits(5, 3)
    assert MYSQL.user_limits(5, 3) == "WITH MAX_USER_CONNECTIONS 5"
    assert MARIADB.read_counters == ("Rows_read",)
    assert "Handler_read_rnd_next" in MYSQL.read_counters_sql()


def test_names_fit_mysql_limits_and_passwords_are_derived() -> None:
    naming = Naming("p_", "t_", "sy_", b"a-secret-of-some-length")
    assert naming.tenant_schema("acme") == "t_acme"
    assert naming.tenant_user("acme") == "sy_t_acme"
    assert naming.tenant_schema("a-b") == "t_a_b"
    long = naming.tenant_user("x" * 60)
    assert len(long) <= MAX_USER and long != naming.tenant_user("x" * 59)
    assert naming.ops_db == "p_game_ops" and naming.pay_db == "p_game_pay"
    assert naming.password("sy_t_acme") == naming.password("sy_t_acme")
    assert naming.password("sy_t_acme") != naming.password("sy_t_nova")
    other = Naming("p_", "t_", "sy_", b"another-secret-value")
    assert other.password("sy_t_acme") != naming.password("sy_t_acme")
    with pytest.raises(ValueError):
        naming.tenant_schema("../etc")


def plan(*rows: tuple[int, str, str, int, str]) -> list[dict[str, object]]:
    return [
        {"id": i, "select_type": "SIMPLE", "table": t, "type": ty, "rows": r, "extra": ex}
        for i, t, ty, r, ex in rows
    ]


def test_gate_refuses_a_full_scan_of_a_large_table() -> None:
    verdict = judge(plan((1, "sessions", "ALL", 50_000, "Using where")), LIMITS)
    assert not verdict.ok and verdict.rule == rules.EXPLAIN_FULL_SCAN
    assert "sessions" in (verdict.detail or "") and verdict.plan[0]["rows"] == 50_000


def test_gate_counts_a_full_index_scan_as_a_full_scan() -> None:
    verdict = judge(plan((1, "daily_activity", "index", 9_000, "Using index")), LIMITS)
    assert verdict.rule == rules.EXPLAIN_FULL_SCAN


def test_gate_counts_a_lookup_on_the_tenant_key_alone_as_a_full_scan() -> None:
    row = {"id": 1, "table": "sessions", "type": "ref", "key": "by_player", "key_len": "258",
           "ref": "const", "rows": 25_000, "extra": "Using where"}  # fmt: skip
    verdict = judge([row], LIMITS)
    assert verdict.rule == rules.EXPLAIN_FULL_SCAN and "tenant's view" in (verdict.detail or "")
    narrower = {**row, "type": "range", "key_len": "261", "ref": None}  # tenant + a date range
    assert judge([narrower], LIMITS).rule == rules.EXPLAIN_ROWS


def test_gate_lets_a_full_scan_of_a_small_table_through() -> None:
    assert judge(plan((1, "regions", "ALL", 5, "")), LIMITS).ok


def test_gate_multiplies_joined_rows_and_adds_selects() -> None:
    joined = judge(plan((1, "a", "ref", 200, ""), (1, "b", "ref", 100, "")), LIMITS)
    assert not joined.ok and joined.rule == rules.EXPLAIN_ROWS
    assert joined.rows_estimated == 20_000
    separate = judge(plan((1, "a", "ref", 200, ""), (2, "b", "ref", 100, "")), LIMITS)
    assert separate.ok and separate.rows_estimated == 300


def test_gate_refuses_big_sorts_and_temporary_tables() -> None:
    verdict = judge(plan((1, "daily_activity", "range", 8_000, "Using temporary; Using filesort")),
                    LIMITS)  # fmt: skip
    assert not verdict.ok and verdict.rule == rules.EXPLAIN_SORT
    assert judge(plan((1, "agg", "range", 800, "Using filesort")), LIMITS).ok


def test_gate_survives_odd_plan_values() -> None:
    odd = [{"id": None, "table": None, "type": None, "rows": None, "extra": None}]
    assert judge(odd, LIMITS).ok
    huge = plan(*[(1, f"t{i}", "ref", 10**6, "") for i in range(30)])
    assert judge(huge, LIMITS).rule == rules.EXPLAIN_ROWS


def test_cells() -> None:
    assert to_cell(decimal.Decimal("12.00")) == 12
    assert to_cell(decimal.Decimal("1.5")) == 1.5
    assert to_cell(dt.date(2025, 1, 2)) == "2025-01-02"
    assert to_cell(dt.datetime(2025, 1, 2, 3, 4, 5)) == "2025-01-02T03:04:05"
    assert to_cell(dt.timedelta(seconds=90)) == 90.0
    assert to_cell(b"\xffab") == "\ufffdab"
    assert to_cell({"b", "a"}) == "a,b"
    assert to_cell(None) is None and to_cell(True) is True


def test_secrets_have_no_working_defaults_outside_local() -> None:
    from pydantic import ValidationError

    from switchyard.sqldb.settings import ExecutorConfig, GuardSettings

    assert GuardSettings(env="local").sql_signing_key.get_secret_value()
    with pytest.raises(ValidationError, match="SY_SQL_SIGNING_KEY"):
        GuardSettings(env="production")
    with pytest.raises(ValidationError, match="SIGNING_KEY"):
        GuardSettings(env="production", sql_signing_key="too-short")
    with pytest.raises(ValidationError, match="SQL_DB_SECRET"):  # the base class's check
        ExecutorConfig(env="production", sql_signing_key="k" * 40)
    ok = ExecutorConfig(env="production", sql_signing_key="k" * 40, sql_db_secret="s" * 20)
    assert ok.sql_db_secret.get_secret_value() == "s" * 20
