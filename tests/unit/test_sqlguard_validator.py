"""The validator on ordinary questions, canonical SQL, LIMITs, column allowlists,
policies, and its fail-closed behaviour."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchyard.sqldb.naming import Naming
from switchyard.sqldb.provision import tenant_policy
from switchyard.sqlguard import Policy, PolicyStore, load_policy, rules, validate
from switchyard.sqlguard import validator as validator_module

NAMING = Naming("", "t_", "sy_", b"unit-test-secret")
ACME = tenant_policy(NAMING, "acme", 500)

# A hand-written policy whose lists leave out columns the views have.
RESTRICTED = Policy(
    database="t_acme",
    max_limit=100,
    tables={
        "t_acme.players": "*",
        "t_acme.daily_activity": ["day", "server_id", "dau", "player_id"],
        "t_acme.orders": ["order_id", "player_id", "created_at"],
    },
)

GOOD = [
    "SELECT day, SUM(dau) AS dau FROM agg_dau_daily WHERE day >= '2025-02-01' GROUP BY day "
    "ORDER BY day",
    "SELECT channel, SUM(revenue_cents) / 100 AS revenue FROM t_acme.agg_revenue_daily "
    "GROUP BY channel ORDER BY revenue DESC LIMIT 10",
    "SELECT cohort_day, SUM(d1) / SUM(cohort_size) AS d1_rate FROM agg_retention GROUP BY "
    "cohort_day HAVING SUM(cohort_size) > 10",
    "WITH payers AS (SELECT player_id, SUM(amount_cents) AS spent FROM orders WHERE status = "
    "'paid' GROUP BY player_id) SELECT p.country, COUNT(*), AVG(y.spent) FROM payers y JOIN "
    "players p ON p.player_id = y.player_id GROUP BY p.country",
    "SELECT s.name, COUNT(DISTINCT a.player_id) FROM daily_activity a JOIN servers s USING "
    "(server_id) WHERE a.day BETWEEN '2025-01-01' AND '2025-01-07' GROUP BY s.name",
    "SELECT level, players_reached, players_completed / players_reached AS pass_rate FROM "
    "level_funnel WHERE server_id = 101 ORDER BY level",
    "SELECT nickname, RANK() OVER (PARTITION BY server_id ORDER BY level DESC) AS r FROM players",
    "SELECT DATE_FORMAT(created_at, '%Y-%m') AS month, COUNT(*) FROM orders GROUP BY month",
    "SELECT e.name FROM events e WHERE EXISTS (SELECT 1 FROM orders o WHERE o.created_at "
    "BETWEEN e.starts_on AND e.ends_on)",
    "SELECT name FROM regions UNION SELECT name FROM servers",
    "SELECT CASE WHEN level >= 30 THEN 'veteran' ELSE 'new' END AS kind, COUNT(*) FROM "
    "players GROUP BY kind",
    "SELECT DATE_ADD(MAX(day), INTERVAL 1 DAY), DATEDIFF(MAX(day), MIN(day)) FROM daily_activity",
    "SELECT 1 FROM DUAL",
]


@pytest.mark.parametrize("sql", GOOD)
def test_ordinary_questions_are_accepted_and_canonical(sql: str) -> None:
    verdict = validate(sql, ACME)
    assert verdict.ok, (verdict.rule, verdict.detail, verdict.node)
    assert verdict.sql is not None
    assert verdict.sql.rstrip().endswith(tuple(f"LIMIT {n}" for n in (10, 500)))
    again = validate(verdict.sql, ACME)
    assert again.ok and again.sql == verdict.sql  # what the executor re-checks
    assert verdict.policy_version == ACME.policy_version


def test_canonical_sql_qualifies_tables_quotes_names_and_drops_comments() -> None:
    verdict = validate("select nickname /* who */ from PLAYERS -- all\n where level > 3", ACME)
    assert verdict.ok
    assert verdict.sql == ("SELECT `nickname` FROM `t_acme`.`players` WHERE `level` > 3 LIMIT 500")
    assert verdict.tables == ("t_acme.players",)


def test_dual_is_dropped_not_quoted_into_a_table() -> None:
    assert validate("SELECT 1 + 1 FROM DUAL", ACME).sql == "SELECT 1 + 1 LIMIT 500"
    assert not validate("SELECT 1 FROM `DUAL`", ACME).ok  # a table called DUAL: not a view


def test_limit_injected_clamped_or_kept() -> None:
    assert validate("SELECT nickname FROM players", ACME).limit_action == "injected"
    clamped = validate("SELECT nickname FROM players LIMIT 100000", ACME)
    assert clamped.limit_action == "clamped" and clamped.sql and clamped.sql.endswith("LIMIT 500")
    kept = validate("SELECT nickname FROM players LIMIT 5, 20", ACME)
    assert kept.limit_action is None and kept.sql and kept.sql.endswith("LIMIT 20 OFFSET 5")
    union = validate("SELECT name FROM regions UNION SELECT name FROM servers", ACME)
    assert union.sql and union.sql.endswith("LIMIT 500")


def test_limit_rejected_under_a_strict_policy() -> None:
    strict = ACME.model_copy(update={"on_missing_limit": "reject", "on_oversized_limit": "reject"})
    assert validate("SELECT nickname FROM players", strict).rule == rules.LIMIT_MISSING
    assert validate("SELECT nickname FROM players LIMIT 501", strict).rule == rules.LIMIT_TOO_LARGE
    assert validate("SELECT nickname FROM players LIMIT 500", strict).ok


@pytest.mark.parametrize(
    ("sql", "rule"),
    [
        ("SELECT secret FROM daily_activity", rules.COLUMN_NOT_ALLOWED),
        ("SELECT d.secret FROM daily_activity d", rules.COLUMN_NOT_ALLOWED),
        ("SELECT t_acme.daily_activity.secret FROM daily_activity", rules.COLUMN_NOT_ALLOWED),
        ("SELECT `SECRET` FROM daily_activity", rules.COLUMN_NOT_ALLOWED),
        ("SELECT * FROM daily_activity", rules.COLUMN_STAR),
        ("SELECT d.* FROM daily_activity d", rules.COLUMN_STAR),
        ("SELECT * FROM players p JOIN daily_activity d USING (player_id)", rules.COLUMN_STAR),
        ("SELECT day FROM daily_activity WHERE minutes > 5", rules.COLUMN_NOT_ALLOWED),
        ("SELECT day FROM daily_activity ORDER BY minutes", rules.COLUMN_NOT_ALLOWED),
        ("SELECT day AS d FROM daily_activity GROUP BY channel", rules.COLUMN_NOT_ALLOWED),
        ("SELECT x.m FROM (SELECT minutes AS m FROM daily_activity) x", rules.COLUMN_NOT_ALLOWED),
        ("WITH c AS (SELECT minutes FROM daily_activity) SELECT * FROM c",
         rules.COLUMN_NOT_ALLOWED),
        ("SELECT nickname FROM players WHERE player_id IN (SELECT player_id FROM daily_activity "
         "WHERE minutes > 1)", rules.COLUMN_NOT_ALLOWED),
        # an unqualified name in a correlated subquery could reach the outer restricted view
        ("SELECT day FROM daily_activity d WHERE EXISTS (SELECT 1 FROM players p WHERE "
         "p.level > minutes)", rules.COLUMN_NOT_ALLOWED),
        ("SELECT o.order_id FROM orders o JOIN players p USING (amount_cents)",
         rules.COLUMN_NOT_ALLOWED),
        ("SELECT z.day FROM daily_activity d", rules.COLUMN_UNKNOWN_SOURCE),
        ("SELECT nickname FROM t_acme.sessions", rules.TABLE_NOT_ALLOWED),
    ],
)  # fmt: skip
def test_column_allowlist_with_hidden_columns(sql: str, rule: str) -> None:
    verdict = validate(sql, RESTRICTED)
    assert not verdict.ok and verdict.rule == rule, (verdict.rule, verdict.detail)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT day, dau FROM daily_activity",
        "SELECT d.day AS secret FROM daily_activity d ORDER BY secret",
        "SELECT COUNT(*) FROM daily_activity",
        "SELECT p.*, d.dau FROM players p JOIN daily_activity d ON d.player_id = p.player_id",
        "SELECT nickname, level FROM players WHERE level > 3",  # "*" table: any name
        "SELECT x.n FROM (SELECT COUNT(*) AS n FROM daily_activity) x",
    ],
)
def test_column_allowlist_accepts_what_it_allows(sql: str) -> None:
    verdict = validate(sql, RESTRICTED)
    assert verdict.ok, (verdict.rule, verdict.detail)


def test_exact_column_lists_know_every_column() -> None:
    # Provisioned policies list every column of each view (exact_columns).
    assert validate("SELECT nickname, no_such_column FROM players", ACME).rule == (
        rules.COLUMN_NOT_ALLOWED
    )
    having_alias = "SELECT day, COUNT(*) AS n FROM daily_activity GROUP BY day HAVING n > 5"
    assert validate(having_alias, ACME).ok
    assert validate("SELECT * FROM players", ACME).ok  # * is exactly the listed columns
    # Where `n` could be a hidden column (MySQL's HAVING would prefer it), the canonical
    # SQL uses the alias's expression instead: no hidden column is reachable.
    restricted = validate(having_alias, RESTRICTED)
    assert restricted.ok and restricted.sql is not None
    assert "HAVING COUNT(*) > 5" in restricted.sql and "`n` >" not in restricted.sql


def test_database_mismatch_and_unqualified_without_database() -> None:
    assert validate("SELECT 1", ACME, database="t_nova").rule == rules.DATABASE_MISMATCH
    no_db = RESTRICTED.model_copy(update={"database": None})
    assert validate("SELECT day FROM daily_activity", no_db).rule == rules.TABLE_UNQUALIFIED
    assert validate("SELECT day FROM t_acme.daily_activity", no_db).ok


def test_allow_any_table_checks_structure_only() -> None:
    any_policy = Policy()
    assert validate(
        "SELECT a FROM whatever.t JOIN x USING (b)", any_policy, allow_any_table=True
    ).ok
    assert not validate("SELECT * FROM mysql.user", any_policy, allow_any_table=True).ok
    assert not validate("SELECT SLEEP(1)", any_policy, allow_any_table=True).ok
    assert not validate("SELECT a FROM t", any_policy).ok  # no table is allowed without the flag


def test_parser_errors_fail_closed() -> None:
    for sql in ("SELECT FROM WHERE", "SELECT 'unterminated", "SELECT `open", "((("):
        verdict = validate(sql, ACME)
        assert not verdict.ok and verdict.rule in (rules.PARSE_ERROR, rules.INPUT_TOO_DEEP)
        assert "\x1b" not in (verdict.detail or "")  # no terminal colour codes


def test_any_exception_inside_is_a_rejection(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: object) -> None:
        raise KeyError("surprise")

    monkeypatch.setattr(validator_module, "check_tree", boom)
    verdict = validate("SELECT 1", ACME)
    assert not verdict.ok and verdict.rule == rules.VALIDATOR_INTERNAL

    def deep(*_: object) -> None:
        raise RecursionError

    monkeypatch.setattr(validator_module, "check_tree", deep)
    assert validate("SELECT 1", ACME).rule == rules.PARSE_RECURSION


def test_regeneration_that_does_not_round_trip_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = validator_module.render
    calls = {"n": 0}

    def flaky(root: object) -> str:
        calls["n"] += 1
        text = real(root)  # type: ignore[arg-type]
        return text if calls["n"] == 1 else text + " "

    monkeypatch.setattr(validator_module, "render", flaky)
    assert validate("SELECT 1", ACME).rule == rules.CANONICAL_UNSTABLE


def test_policy_files(tmp_path: Path) -> None:
    good = tmp_path / "acme.yaml"
    good.write_text(
        "dialect: mysql\nmax_limit: 50\n"
        "tables: {t_acme.players: '*', t_acme.daily_activity: [day, server_id, dau]}\n"
    )
    policy = load_policy(good)
    assert policy.max_limit == 50 and policy.allowed[("t_acme", "players")].columns is None
    assert validate("SELECT dau FROM t_acme.daily_activity", policy).ok
    for body in (
        "tables: {mysql.user: '*'}\n",  # system schemas can never be allowed
        "max_limit: 0\n",
        "dialect: postgres\n",
        "surprise: 1\n",  # unknown keys are refused, not ignored
        "tables: {players: '*'}\n",  # must be schema.table
        "- a list\n",
    ):
        bad = tmp_path / "bad.yaml"
        bad.write_text(body)
        with pytest.raises(ValueError):
            load_policy(bad)
    edited = policy.model_copy(update={"max_limit": 51})
    assert edited.policy_version != policy.policy_version


def test_policy_store_reads_tenant_files_and_refuses_path_tricks(tmp_path: Path) -> None:
    (tmp_path / "acme.yaml").write_text("max_limit: 7\n")
    store = PolicyStore(tmp_path)
    first = store.get("acme")
    assert first is not None and first.max_limit == 7
    assert store.get("acme") is first  # cached while the file is unchanged
    (tmp_path / "acme.yaml").write_text("max_limit: 8\n")
    again = store.get("acme")
    assert again is not None and again.max_limit == 8
    assert store.get("nobody") is None
    assert store.get("../acme") is None
