"""`sy sql demo-db` on the real MariaDB: shape, idempotence, aggregates that agree with
the raw tables, and refusal to touch databases it did not create."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pymysql
import pytest

from switchyard.sqldb import demo
from switchyard.sqldb.settings import DemoSettings
from tests.conftest import REPO
from tests.support.sqlenv import DAYS, DEMO_TENANTS, PLAYERS, SqlEnv


def one(conn: Any, sql: str) -> Any:
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def test_demo_db_has_big_raw_tables_and_small_aggregates(sqlenv: SqlEnv) -> None:
    rows = sqlenv.rows
    assert rows["players"] == PLAYERS
    assert rows["daily_activity"] > 20_000 and rows["sessions"] > 30_000
    assert rows["orders"] > 300 and rows["payments"] == rows["orders"]
    for agg in ("agg_dau_daily", "agg_retention", "agg_revenue_daily"):
        assert 0 < rows[agg] < rows["daily_activity"] / 3, agg
    assert (
        rows["servers"] == len(DEMO_TENANTS) * 8 and rows["regions"] == 5 and rows["pay_tiers"] == 6
    )


def test_demo_db_is_idempotent(sqlenv: SqlEnv) -> None:
    conn = sqlenv.admin()
    try:
        started = time.monotonic()
        again = demo.generate(
            conn, sqlenv.naming.ops_db, sqlenv.naming.pay_db,
            DemoSettings(sql_demo_players=PLAYERS, sql_demo_days=DAYS,
                         sql_demo_tenants=list(DEMO_TENANTS)),
        )  # fmt: skip
        assert again.action == "unchanged"
        assert again.rows == sqlenv.rows
        assert time.monotonic() - started < 2.0
    finally:
        conn.close()


def test_aggregates_agree_with_the_raw_tables(sqlenv: SqlEnv) -> None:
    ops, pay = sqlenv.naming.ops_db, sqlenv.naming.pay_db
    conn = sqlenv.admin()
    try:
        raw_dau = one(conn, f"SELECT day, COUNT(*) FROM {ops}.daily_activity "
                            "WHERE tenant_id = 'acme' GROUP BY day ORDER BY day")  # fmt: skip
        agg_dau = one(conn, f"SELECT day, SUM(dau) FROM {ops}.agg_dau_daily "
                            "WHERE tenant_id = 'acme' GROUP BY day ORDER BY day")  # fmt: skip
        assert [(d, int(n)) for d, n in raw_dau] == [(d, int(n)) for d, n in agg_dau]
        assert len(raw_dau) == DAYS
        raw_rev = one(conn, f"SELECT DATE(created_at), SUM(amount_cents) FROM {pay}.orders "
                            "WHERE tenant_id = 'nova' AND status IN ('paid', 'refunded') "
                            "GROUP BY DATE(created_at) ORDER BY 1")  # fmt: skip
        agg_rev = one(conn, f"SELECT day, SUM(revenue_cents) FROM {pay}.agg_revenue_daily "
                            "WHERE tenant_id = 'nova' GROUP BY day ORDER BY day")  # fmt: skip
        assert [(d, int(n)) for d, n in raw_rev] == [(d, int(n)) for d, n in agg_rev]
        # retention falls with time, as a retention curve should
        d1, d7, d30 = one(conn, f"SELECT SUM(d1), SUM(d7), SUM(d30) FROM {ops}.agg_retention "
                                "WHERE tenant_id = 'acme'")[0]  # fmt: skip
        assert d1 > d7 > d30 > 0
        # the biggest studio has the most players (weights 4:3:2:1)
        counts = dict(one(conn, f"SELECT tenant_id, COUNT(*) FROM {ops}.players GROUP BY 1"))
        assert counts["acme"] > counts["nova"] > counts["orbit"] > counts["zen"]
    finally:
        conn.close()


def test_a_database_it_did_not_create_is_refused(mysql_conn: Any, unique: str) -> None:
    prefix = f"s7x{unique}_"
    with mysql_conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{prefix}game_ops`")
        try:
            cur.execute(f"CREATE TABLE `{prefix}game_ops`.precious (a INT)")
            with pytest.raises(demo.DemoError, match="not made by"):
                demo.generate(mysql_conn, f"{prefix}game_ops", f"{prefix}game_pay",
                              DemoSettings(sql_demo_players=10, sql_demo_days=2))  # fmt: skip
            cur.execute(f"SELECT COUNT(*) FROM `{prefix}game_ops`.precious")
            assert cur.fetchone() == (0,)  # still there, untouched
        finally:
            cur.execute(f"DROP DATABASE IF EXISTS `{prefix}game_ops`")
            cur.execute(f"DROP DATABASE IF EXISTS `{prefix}game_pay`")


def test_cli_demo_db_reports_unchanged(sqlenv: SqlEnv) -> None:
    env = {**os.environ, "SY_MYSQL_DSN": sqlenv.dsn, "COLUMNS": "200", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "switchyard.cli.app", "sql", "demo-db", "--prefix", sqlenv.prefix,
         "--players", str(PLAYERS), "--days", str(DAYS), "--tenants", ",".join(DEMO_TENANTS)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "unchanged" in done.stdout and "daily_activity" in done.stdout


def test_cli_provision_is_idempotent_and_writes_a_policy(sqlenv: SqlEnv, tmp_path: Any) -> None:
    env = {
        **os.environ, "SY_MYSQL_DSN": sqlenv.dsn, "SY_SQL_DB_SECRET": sqlenv.db_secret,
        "SY_SQL_DEMO_PREFIX": sqlenv.prefix, "SY_SQL_SCHEMA_PREFIX": sqlenv.prefix + "t_",
        "SY_SQL_ACCOUNT_PREFIX": sqlenv.prefix, "SY_SQL_AUDIT_DB": sqlenv.audit_db,
        "SY_SQL_USER_STATEMENT_SECONDS": "1", "SY_SQL_MAX_USER_CONNECTIONS": "6",
        "COLUMNS": "200", "NO_COLOR": "1",
    }  # fmt: skip
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-m", "switchyard.cli.app", "sql", "provision", "--tenant", "acme",
             "--policy-dir", str(tmp_path)],
            capture_output=True, text=True, cwd=REPO, env=env, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    assert "14 views" in done.stdout and "auditor" in done.stdout
    assert (tmp_path / "acme.yaml").read_text() == (sqlenv.policy_dir / "acme.yaml").read_text()
    conn = sqlenv.tenant_conn("acme")  # the password is still the derived one
    conn.close()
    with pytest.raises(pymysql.err.OperationalError):
        sqlenv.tenant_conn("nobody-here")
