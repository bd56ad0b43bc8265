"""Select aliases in GROUP BY / HAVING / ORDER BY on the real MariaDB: the canonical SQL
the validator writes (aliases replaced by their expressions where MariaDB resolves them
so) returns the same rows as the original, on the demo data behind a tenant's views;
and where an alias names a column the policy hides, the canonical SQL never reads it."""

from __future__ import annotations

from typing import Any

import pytest

from switchyard.sqlguard import validate
from switchyard.sqlguard.policy import Policy
from tests.support.sqlenv import SqlEnv

TENANT = "acme"

# Valid MariaDB, each leaning on one resolution rule.
PARITY = [
    # the case: group and order by a select alias
    "SELECT registered_on AS d, COUNT(*) AS n FROM players GROUP BY d ORDER BY d",
    "SELECT DATE_FORMAT(registered_on, '%Y-%m') AS m, COUNT(*) AS n FROM players "
    "GROUP BY m ORDER BY m",
    # HAVING on an aggregate's alias; ORDER BY the aggregate alias
    "SELECT country AS c, COUNT(*) AS n FROM players GROUP BY c HAVING n > 100 ORDER BY n DESC, c",
    # HAVING on an alias of a grouped expression
    "SELECT server_id AS s, SUM(minutes) AS total FROM daily_activity GROUP BY s "
    "HAVING s > 2 ORDER BY s",
    # ordinals
    "SELECT channel AS ch, COUNT(*) AS n FROM players GROUP BY 1 ORDER BY 2 DESC, 1",
    # an alias shadowing a real column: GROUP BY takes the column, ORDER BY the alias
    "SELECT DATE_FORMAT(registered_on, '%Y-%m') AS registered_on, COUNT(*) AS n "
    "FROM players GROUP BY registered_on ORDER BY registered_on, n",
    # the same name as alias and column in HAVING: the column (grouped) wins
    "SELECT level AS lvl, level + 0 AS level, COUNT(*) AS n FROM players GROUP BY level "
    "HAVING level > 10 ORDER BY lvl",
    # an aggregate named like its column (as the demo tenant's verified queries do)
    "SELECT channel, SUM(minutes) AS minutes FROM daily_activity GROUP BY channel "
    "ORDER BY minutes DESC",
    # nested: the alias belongs to the derived table's own GROUP BY
    "SELECT d, n FROM (SELECT day AS d, COUNT(*) AS n FROM daily_activity GROUP BY d) x "
    "WHERE n > 0 ORDER BY d",
    # an alias inside an expression of HAVING and of ORDER BY
    "SELECT country AS c, COUNT(*) AS n FROM players GROUP BY c HAVING n * 2 > 200 "
    "ORDER BY CONCAT(c, '!')",
    # a subquery in HAVING has its own scope: its `n` is its own alias's column
    "SELECT country AS c, COUNT(*) AS n FROM players GROUP BY c "
    "HAVING n > (SELECT COUNT(*) / 100 AS n FROM players) ORDER BY c",
    # a join with qualified sources
    "SELECT p.country AS c, SUM(a.minutes) AS m FROM players p JOIN daily_activity a "
    "ON a.player_id = p.player_id GROUP BY c ORDER BY m DESC, c",
    # DISTINCT with ORDER BY an alias
    "SELECT DISTINCT channel AS ch FROM players ORDER BY ch",
]


def rows(conn: Any, schema: str, sql: str) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(f"USE `{schema}`")
        cur.execute(sql)
        return [tuple(r) for r in cur.fetchall()]


@pytest.fixture(scope="module")
def policy(sqlenv: SqlEnv) -> Policy:
    found = sqlenv.policies().get(TENANT)
    assert found is not None and found.exact_columns
    return found


@pytest.mark.parametrize("sql", PARITY)
def test_the_canonical_sql_returns_the_originals_rows(
    sqlenv: SqlEnv, policy: Policy, sql: str
) -> None:
    verdict = validate(sql, policy)
    assert verdict.ok and verdict.sql, verdict
    assert validate(verdict.sql, policy).sql == verdict.sql, "the executor re-validates it"
    conn = sqlenv.tenant_conn(TENANT)
    try:
        schema = sqlenv.schema(TENANT)
        original = rows(conn, schema, sql + " LIMIT 1000")
        canonical = rows(conn, schema, verdict.sql)
    finally:
        conn.close()
    assert original, "the case must return rows to mean anything"
    assert canonical == original


def test_an_alias_named_like_a_hidden_column_never_reads_it(sqlenv: SqlEnv, policy: Policy) -> None:
    """MariaDB's GROUP BY prefers a column: with `level` hidden by the policy, the original
    groups by the hidden `level`. The canonical SQL groups by the alias's expression."""
    players = f"{policy.database}.players"
    columns = [c for c in policy.tables[players] if c != "level"]
    hiding = policy.model_copy(
        update={"exact_columns": False, "tables": {**policy.tables, players: columns}}
    )
    sql = "SELECT country AS level, COUNT(*) AS n FROM players GROUP BY level ORDER BY n, level"
    verdict = validate(sql, hiding)
    assert verdict.ok and verdict.sql, verdict
    assert "GROUP BY `country`" in verdict.sql
    conn = sqlenv.tenant_conn(TENANT)
    try:
        schema = sqlenv.schema(TENANT)
        canonical = rows(conn, schema, verdict.sql)
        by_country = rows(conn, schema, "SELECT country, COUNT(*) AS n FROM players "
                                        "GROUP BY country ORDER BY n, country")  # fmt: skip
        by_hidden_level = rows(conn, schema, sql)
    finally:
        conn.close()
    assert canonical == by_country
    assert canonical != by_hidden_level, "the original would have grouped by the hidden column"
    # Named on its own, the hidden column is still refused.
    assert validate("SELECT level FROM players", hiding).rule == "column.not_allowed"
