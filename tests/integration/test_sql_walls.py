"""The database is the last wall: what a tenant account can and cannot do on its own,
and the whole attack suite run directly on it, bypassing the validator."""

from __future__ import annotations

import re
import time
from typing import Any

import pymysql
import pytest

from tests.support.sql_attacks import ATTACKS, Attack
from tests.support.sqlenv import MAX_USER_CONNECTIONS, USER_STATEMENT_SECONDS, SqlEnv


def rows_of(conn: Any, sql: str) -> Any:
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def denied(conn: Any, sql: str) -> int:
    with pytest.raises(pymysql.err.MySQLError) as info:
        rows_of(conn, sql)
    return int(info.value.args[0])


def test_tenant_account_holds_select_on_its_own_views_and_nothing_else(sqlenv: SqlEnv) -> None:
    conn = sqlenv.tenant_conn("acme")
    try:
        grants = [g for (g,) in rows_of(conn, "SHOW GRANTS")]
    finally:
        conn.close()
    schema = sqlenv.schema("acme")
    views = 0
    for grant in grants:
        if grant.startswith("GRANT USAGE ON *.*"):
            assert f"MAX_USER_CONNECTIONS {MAX_USER_CONNECTIONS}" in grant
            assert "MAX_STATEMENT_TIME 1.0" in grant
            continue
        assert re.fullmatch(rf"GRANT SELECT ON `{schema}`\.`\w+` TO .*", grant), grant
        views += 1
    assert views == 14
    text = " ".join(grants)
    for privilege in ("FILE", "PROCESS", "SUPER", "ALL PRIVILEGES", "SHOW VIEW", "GRANT OPTION"):
        assert privilege not in text


def test_each_view_carries_its_tenant_filter(sqlenv: SqlEnv) -> None:
    admin = sqlenv.admin()
    try:
        for tenant in ("acme", "nova"):
            conn = sqlenv.tenant_conn(tenant)
            try:
                names = rows_of(conn, f"SELECT nickname FROM {sqlenv.schema(tenant)}.players")
                (base,) = rows_of(admin, f"SELECT COUNT(*) FROM {sqlenv.naming.ops_db}.players "
                                         f"WHERE tenant_id = '{tenant}'")[0]  # fmt: skip
            finally:
                conn.close()
            assert len(names) == base > 0
            assert all(n.startswith(f"{tenant}_player_") for (n,) in names)
    finally:
        admin.close()


@pytest.mark.parametrize(
    "target",
    ["{ops}.players", "{pay}.orders", "{o}.players", "{o}.agg_dau_daily", "mysql.user",
     "performance_schema.threads", "sys.version", "{ops}._meta"],
)  # fmt: skip
def test_base_tables_other_tenants_and_system_tables_are_denied(
    sqlenv: SqlEnv, target: str
) -> None:
    table = (target.replace("{ops}", sqlenv.naming.ops_db).replace("{pay}", sqlenv.naming.pay_db)
             .replace("{o}", sqlenv.schema("nova")))  # fmt: skip
    conn = sqlenv.tenant_conn("acme")
    try:
        assert denied(conn, f"SELECT * FROM {table} LIMIT 1") in (1142, 1044, 1146)
    finally:
        conn.close()


def test_no_file_and_no_process_privilege(sqlenv: SqlEnv) -> None:
    conn = sqlenv.tenant_conn("acme")
    try:
        code = denied(conn, f"SELECT 1 INTO OUTFILE '/tmp/{sqlenv.prefix}out'")
        assert code in (1227, 1045)  # needs FILE
        assert rows_of(conn, "SELECT LOAD_FILE('/etc/passwd')") == ((None,),)
        user = sqlenv.naming.tenant_user("acme")
        for _, who, *_rest in rows_of(conn, "SHOW PROCESSLIST"):
            assert who == user  # only its own threads: no PROCESS
        others = rows_of(conn, "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                               f"WHERE USER <> '{user}'")  # fmt: skip
        assert others == ((0,),)
        assert denied(conn, "KILL 1") in (1094, 1095)  # not its thread
        assert denied(conn, f"EXPLAIN SELECT * FROM {sqlenv.schema('acme')}.players") == 1345
    finally:
        conn.close()


def test_connection_cap(sqlenv: SqlEnv) -> None:
    held = [sqlenv.tenant_conn("nova") for _ in range(MAX_USER_CONNECTIONS)]
    try:
        with pytest.raises(pymysql.err.OperationalError) as info:
            sqlenv.tenant_conn("nova")
        assert info.value.args[0] == 1226  # max_user_connections
    finally:
        for c in held:
            c.close()


def test_per_user_statement_time_stops_a_heavy_query(sqlenv: SqlEnv) -> None:
    conn = sqlenv.tenant_conn("acme")
    schema = sqlenv.schema("acme")
    try:
        assert rows_of(conn, "SELECT @@max_statement_time") == ((USER_STATEMENT_SECONDS,),)
        started = time.monotonic()
        code = denied(conn, f"SELECT COUNT(*) FROM {schema}.sessions a, {schema}.sessions b")
        assert code == 1969 and time.monotonic() - started < USER_STATEMENT_SECONDS + 1
    finally:
        conn.close()


def test_auditor_can_only_insert(sqlenv: SqlEnv) -> None:
    user = sqlenv.naming.auditor_user
    params = {"host": "127.0.0.1", "user": user, "password": sqlenv.naming.password(user)}
    conn = pymysql.connect(**params, autocommit=True)  # type: ignore[arg-type]
    table = f"{sqlenv.audit_db}.sql_audit"
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {table} (at, request_id, tenant, event, actor, verdict) "
                "VALUES (NOW(6), 'r1', 'acme', 'sql.execute', 'executor', 'ok')"
            )
        for sql in (f"SELECT * FROM {table}", f"UPDATE {table} SET verdict = 'x'",
                    f"DELETE FROM {table}", f"DROP TABLE {table}"):  # fmt: skip
            assert denied(conn, sql) in (1142, 1044)
    finally:
        conn.close()


# --- the attack suite, straight at the database -----------------------------------------


@pytest.fixture(scope="module")
def snapshot(sqlenv: SqlEnv) -> dict[str, Any]:
    return state(sqlenv)


def state(sqlenv: SqlEnv) -> dict[str, Any]:
    admin = sqlenv.admin()
    try:
        counts = {}
        for db in (sqlenv.naming.ops_db, sqlenv.naming.pay_db):
            for (table,) in rows_of(admin, "SELECT TABLE_NAME FROM information_schema.TABLES "
                                           f"WHERE TABLE_SCHEMA = '{db}'"):  # fmt: skip
                counts[f"{db}.{table}"] = rows_of(admin, f"SELECT COUNT(*) FROM {db}.{table}")
        objects = rows_of(admin, "SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_TYPE FROM "
                                 "information_schema.TABLES WHERE TABLE_SCHEMA LIKE "
                                 f"'{sqlenv.prefix}%' ORDER BY 1, 2")  # fmt: skip
        users = rows_of(admin, f"SELECT User FROM mysql.user WHERE User LIKE '{sqlenv.prefix}%' "
                               "ORDER BY 1")  # fmt: skip
        return {"counts": counts, "objects": objects, "users": users}
    finally:
        admin.close()


def canaries(sqlenv: SqlEnv) -> list[str]:
    """Strings whose appearance in a tenant's result would be a leak."""
    return [
        "nova_player_", "orbit_player_",  # other tenants' rows
        sqlenv.schema("nova"), sqlenv.naming.ops_db, sqlenv.naming.pay_db,  # their names
        "root:x:0:0",  # /etc/passwd
    ]  # fmt: skip


DB_ATTACKS = [a for a in ATTACKS if a.db]


@pytest.mark.parametrize(
    "attack", DB_ATTACKS, ids=[f"{a.category}-{i}" for i, a in enumerate(DB_ATTACKS)]
)
def test_attack_is_refused_or_harmless_on_the_tenant_account(
    sqlenv: SqlEnv, snapshot: dict[str, Any], attack: Attack
) -> None:
    sql = attack.render(
        sqlenv.schema("acme"), sqlenv.schema("nova"), sqlenv.naming.ops_db, sqlenv.naming.pay_db
    )
    conn = sqlenv.tenant_conn("acme", read_timeout=int(USER_STATEMENT_SECONDS) + 10)
    started = time.monotonic()
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            result = repr(cur.fetchall())
    except pymysql.err.MySQLError:
        return  # refused by the database
    finally:
        elapsed = time.monotonic() - started
        conn.close()
    # It ran: it must have read nothing it may not, and stopped in time.
    for canary in canaries(sqlenv):
        assert canary not in result, f"{canary!r} leaked: {result[:300]}"
    assert elapsed < USER_STATEMENT_SECONDS + 2, f"ran {elapsed:.1f}s"


def test_the_attacks_changed_nothing(sqlenv: SqlEnv, snapshot: dict[str, Any]) -> None:
    assert state(sqlenv) == snapshot
    conn = sqlenv.tenant_conn("acme")  # the account still works with its own password
    conn.close()


def test_the_few_statements_only_the_validator_can_stop_are_named() -> None:
    # An account can always change its own password; the executor never runs anything
    # but a validated SELECT, so only stolen credentials could, and a rotation undoes it.
    skipped = [a.sql for a in ATTACKS if not a.db]
    assert skipped == ["SET PASSWORD = PASSWORD('owned')",
                       "ALTER USER CURRENT_USER() IDENTIFIED BY 'owned'"]  # fmt: skip
