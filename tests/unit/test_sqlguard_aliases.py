"""Select aliases in GROUP BY / HAVING / ORDER BY: where MySQL resolves a name to the
alias, the canonical SQL carries the alias's expression; where it resolves to a column,
the column stays and the allowlist judges it. (Row parity on the real MariaDB:
tests/integration/test_sql_aliases.py.)"""

from __future__ import annotations

import pytest

from switchyard.sqlguard import rules, validate
from switchyard.sqlguard.policy import Policy

TABLES = {
    "t_acme.players": ["player_id", "registered_on", "country", "level"],
    "t_acme.daily_activity": ["day", "server_id", "minutes", "player_id"],
}
EXACT = Policy(database="t_acme", exact_columns=True, tables=TABLES)  # what provision writes
LISTED = Policy(database="t_acme", tables=TABLES)  # the views may hold more columns
OPEN = Policy(database="t_acme", tables={"t_acme.players": "*"})


def canonical(sql: str, policy: Policy) -> str:
    verdict = validate(sql, policy)
    assert verdict.ok and verdict.sql is not None, verdict
    # The executor validates the canonical SQL again: it must come back unchanged.
    assert validate(verdict.sql, policy).sql == verdict.sql
    return verdict.sql.removesuffix(" LIMIT 1000")


@pytest.mark.parametrize("policy", [EXACT, LISTED], ids=["exact", "listed"])
def test_group_and_order_by_an_alias_use_its_expression(policy: Policy) -> None:
    sql = "SELECT DATE(registered_on) AS d, COUNT(*) AS n FROM players GROUP BY d ORDER BY d"
    assert canonical(sql, policy).endswith(
        "GROUP BY DATE(`registered_on`) ORDER BY DATE(`registered_on`)"
    )


@pytest.mark.parametrize("policy", [EXACT, LISTED], ids=["exact", "listed"])
def test_having_on_an_aggregate_alias(policy: Policy) -> None:
    sql = "SELECT country AS c, COUNT(*) AS n FROM players GROUP BY c HAVING n > 5"
    assert canonical(sql, policy).endswith("GROUP BY `country` HAVING COUNT(*) > 5")


def test_an_alias_shadowing_a_column_groups_by_the_column_and_orders_by_the_alias() -> None:
    sql = (
        "SELECT DATE(registered_on) AS registered_on FROM players "
        "GROUP BY registered_on HAVING registered_on > '2026-01-01' ORDER BY registered_on"
    )
    assert canonical(sql, EXACT).endswith(
        "GROUP BY `registered_on` HAVING `registered_on` > '2026-01-01' "
        "ORDER BY DATE(`registered_on`)"
    )


def test_an_alias_over_a_hidden_column_name_uses_the_expression() -> None:
    """`secret` is not listed: in a LISTED view it may exist, and MySQL's GROUP BY would
    prefer it. The canonical SQL groups by the alias's expression: never that column."""
    sql = "SELECT country AS secret, COUNT(*) AS n FROM players GROUP BY secret"
    assert canonical(sql, LISTED).endswith("GROUP BY `country`")
    # The hidden column itself stays unreachable, however it is named.
    for attack in (
        "SELECT secret FROM players",
        "SELECT country FROM players GROUP BY secret",
        "SELECT country AS c FROM players ORDER BY secret",
        "SELECT secret AS s FROM players GROUP BY s",
        "SELECT players.secret AS country FROM players GROUP BY country",
    ):
        assert validate(attack, LISTED).rule == rules.COLUMN_NOT_ALLOWED, attack


def test_ordinals_and_plain_columns_are_left_alone() -> None:
    sql = "SELECT country AS c, COUNT(*) AS n FROM players GROUP BY 1 ORDER BY 2 DESC"
    assert canonical(sql, EXACT).endswith("GROUP BY 1 ORDER BY 2 DESC")
    sql = "SELECT country, COUNT(*) AS n FROM players GROUP BY country ORDER BY country"
    assert canonical(sql, LISTED).endswith("GROUP BY `country` ORDER BY `country`")


def test_a_view_with_every_column_allowed_keeps_the_name_for_mysql_to_resolve() -> None:
    # Any column it has is allowed, so whatever MySQL resolves the name to is readable.
    sql = "SELECT DATE(registered_on) AS d FROM players GROUP BY d ORDER BY d"
    assert canonical(sql, OPEN).endswith("GROUP BY `d` ORDER BY DATE(`registered_on`)")


def test_nested_scopes_resolve_their_own_aliases() -> None:
    sql = (
        "SELECT d, n FROM (SELECT day AS d, COUNT(*) AS n FROM daily_activity GROUP BY d) x "
        "ORDER BY d"
    )
    out = canonical(sql, LISTED)
    assert "GROUP BY `day`)" in out and out.endswith("ORDER BY `d`")
    sql = (
        "SELECT country AS c, COUNT(*) AS n FROM players GROUP BY c "
        "HAVING n > (SELECT COUNT(*) AS n FROM players GROUP BY level ORDER BY n LIMIT 1)"
    )
    out = canonical(sql, EXACT)
    assert "HAVING COUNT(*) > (SELECT COUNT(*) AS `n`" in out
    assert "GROUP BY `level` ORDER BY COUNT(*) LIMIT 1)" in out


def test_a_windows_order_by_never_sees_select_aliases() -> None:
    sql = "SELECT day AS d, ROW_NUMBER() OVER (ORDER BY d) AS r FROM daily_activity GROUP BY d"
    # MySQL resolves `d` in OVER (...) to a column: in a LISTED view it may be a hidden one.
    assert validate(sql, LISTED).rule == rules.COLUMN_NOT_ALLOWED
    assert "OVER (ORDER BY `d`)" in canonical(sql, EXACT)  # the database refuses it there


def test_an_alias_given_twice_is_left_for_the_database_to_refuse() -> None:
    sql = "SELECT country AS x, level AS x FROM players ORDER BY x"
    assert canonical(sql, EXACT).endswith("ORDER BY `x`")


def test_a_union_orders_by_its_own_output_names() -> None:
    sql = "SELECT country AS c FROM players UNION SELECT 'zz' AS c ORDER BY c"
    assert canonical(sql, EXACT).endswith("ORDER BY `c`")


def test_a_qualified_name_is_never_an_alias() -> None:
    sql = "SELECT DATE(p.registered_on) AS country FROM players p GROUP BY p.country"
    assert canonical(sql, EXACT).endswith("GROUP BY `p`.`country`")


def test_an_aggregate_named_like_its_column_is_rewritten_once() -> None:
    """A verified query of the demo tenant: `SUM(new_players) AS new_players ... ORDER BY
    new_players`. Inside an aggregate, `new_players` is the column, never the alias."""
    sql = (
        "SELECT country, SUM(level) AS level FROM players GROUP BY country "
        "HAVING SUM(level) > 3 ORDER BY level DESC"
    )
    assert canonical(sql, EXACT).endswith(
        "GROUP BY `country` HAVING SUM(`level`) > 3 ORDER BY SUM(`level`) DESC"
    )


def test_a_name_inside_an_order_by_expression_is_left_as_written() -> None:
    sql = "SELECT country AS c FROM players ORDER BY CONCAT(c, '!')"
    assert canonical(sql, EXACT).endswith("ORDER BY CONCAT(`c`, '!')")
