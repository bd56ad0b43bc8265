"""Hostile SQL by category, for the validator (unit) and the database wall (integration).

`{t}` is the tenant's own schema, `{o}` another tenant's schema, `{ops}`/`{pay}`
the base databases. `expect` is the family (rule-id prefix) the validator must
reject a case with; `strict` cases run under a policy that rejects instead of
rewriting LIMITs. `db` is False for the few statements the database cannot
refuse on its own (an account may always change its own password); the wall
test skips those and says why.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Attack:
    category: str
    sql: str
    expect: tuple[str, ...] = ()
    strict: bool = False
    db: bool = True

    def render(self, t: str, o: str, ops: str, pay: str) -> str:
        return (
            self.sql.replace("{t}", t).replace("{o}", o).replace("{ops}", ops).replace("{pay}", pay)
        )


def _many(category: str, expect: tuple[str, ...], *sqls: str, **kw: bool) -> list[Attack]:
    return [Attack(category, s, expect, **kw) for s in sqls]


STMT = ("statement.",)
TABLE = ("table.",)
SYNTAX = ("syntax.",)
FUNC = ("syntax.function",)
PARSE_OR_STMT = ("parse.", "statement.")

ATTACKS: list[Attack] = [
    *_many(
        "multi_statement", (*STMT, "comment.", "parse."),
        "SELECT 1; DROP TABLE {t}.players",
        "SELECT 1;DELETE FROM {ops}.players",
        "SELECT * FROM {t}.players; SELECT * FROM {o}.players",
        "SELECT 1 -- harmless?\n; DROP DATABASE {ops}",
        "SELECT 1 /* just a comment */; UPDATE {ops}.players SET level = 1",
        "SELECT 1 # hash comment\n; TRUNCATE {ops}.sessions",
        "SELECT 1;;SELECT 2",
        "SELECT 1; SHUTDOWN",
        "SELECT 1; SET GLOBAL max_connections = 1",
        "SELECT 1 /*!; DROP TABLE {t}.players */",
        "SELECT 1 /*M!100000 ; DROP TABLE {t}.players */",
        "SELECT 1;\nGRANT ALL ON *.* TO CURRENT_USER",
        "SELECT '1'; CALL mysql.proc()",
        "SELECT player_id FROM {t}.players WHERE 1 = 1; INSERT INTO {t}.players VALUES (1)",
    ),
    *_many(
        "dml", PARSE_OR_STMT,
        "INSERT INTO {t}.players (player_id) VALUES (1)",
        "UPDATE {t}.players SET level = 99",
        "DELETE FROM {t}.players",
        "REPLACE INTO {t}.players (player_id) VALUES (1)",
        "INSERT INTO {t}.events SELECT * FROM {o}.events",
        "LOAD DATA INFILE '/etc/passwd' INTO TABLE {t}.players",
        "LOAD DATA LOCAL INFILE '/etc/passwd' INTO TABLE {t}.players",
        "UPDATE {ops}.players p JOIN {ops}.servers s ON 1 = 1 SET p.level = 0",
        "DELETE p FROM {t}.players p",
        "INSERT {t}.players SET player_id = 1",
        "INSERT INTO {ops}.players SELECT * FROM {ops}.players",
    ),
    *_many(
        "ddl", PARSE_OR_STMT,
        "CREATE TABLE {t}.x (a INT)",
        "CREATE TEMPORARY TABLE tmp_x (a INT)",
        "CREATE TABLE {t}.x AS SELECT * FROM {o}.players",
        "DROP TABLE {ops}.players",
        "DROP VIEW {t}.players",
        "ALTER TABLE {ops}.players ADD COLUMN x INT",
        "TRUNCATE TABLE {ops}.sessions",
        "RENAME TABLE {ops}.players TO {ops}.p2",
        "CREATE OR REPLACE VIEW {t}.players AS SELECT * FROM {ops}.players",
        "DROP DATABASE {ops}",
        "CREATE DATABASE evil",
        "CREATE INDEX i ON {ops}.players (level)",
        "CREATE FUNCTION f() RETURNS INT RETURN 1",
        "CREATE PROCEDURE p() SELECT 1",
        "CREATE TRIGGER tr BEFORE INSERT ON {ops}.players FOR EACH ROW SET NEW.level = 1",
        "CREATE EVENT e ON SCHEDULE EVERY 1 SECOND DO DELETE FROM {ops}.players",
    ),
    *_many(
        "admin", PARSE_OR_STMT,
        "GRANT SELECT ON {ops}.* TO CURRENT_USER",
        "REVOKE SELECT ON {t}.players FROM CURRENT_USER",
        "CREATE USER evil IDENTIFIED BY 'x'",
        "DROP USER root",
        "FLUSH PRIVILEGES",
        "SHUTDOWN",
        "KILL 1",
        "KILL QUERY 1",
        "SHOW PROCESSLIST",
        "SHOW GRANTS",
        "SHOW DATABASES",
        "SHOW TABLES FROM {o}",
        "SHOW CREATE VIEW {t}.players",
        "INSTALL PLUGIN evil SONAME 'evil.so'",
        "UNINSTALL PLUGIN evil",
        "RESET MASTER",
        "PURGE BINARY LOGS BEFORE NOW()",
        "CHANGE MASTER TO MASTER_HOST = 'evil'",
        "SET GLOBAL general_log = 1",
        "SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES'",
        "SET SESSION max_statement_time = 0",
        "SET NAMES gbk",
        "SET @a = 1",
        "USE {o}",
        "CALL {t}.p()",
        "DO SLEEP(3)",
        "HANDLER {t}.players OPEN",
        "HANDLER {t}.players READ FIRST",
        "LOCK TABLES {t}.players READ",
        "UNLOCK TABLES",
        "PREPARE s FROM 'SELECT * FROM {o}.players'",
        "EXECUTE s",
        "DEALLOCATE PREPARE s",
        "START TRANSACTION",
        "COMMIT",
        "XA START 'x'",
        "ANALYZE TABLE {t}.players",
        "OPTIMIZE TABLE {ops}.players",
        "CHECKSUM TABLE {t}.players",
        "EXPLAIN SELECT * FROM {o}.players",
        "DESCRIBE {o}.players",
        "BINLOG 'AAAA'",
        "SET ROLE ALL",
        "CREATE ROLE r",
    ),
    # Changing one's own password is not a data leak, but no GRANT can stop an account
    # from doing it; only the validator (and the executor never running non-SELECTs) can.
    *_many(
        "admin", PARSE_OR_STMT,
        "SET PASSWORD = PASSWORD('owned')",
        "ALTER USER CURRENT_USER() IDENTIFIED BY 'owned'",
        db=False,
    ),
    *_many(
        "file", ("syntax.", "parse.", "statement."),
        "SELECT * FROM {t}.players INTO OUTFILE '/tmp/sy_attack_out'",
        "SELECT nickname FROM {t}.players INTO DUMPFILE '/tmp/sy_attack_dump'",
        "SELECT 1 INTO OUTFILE '/tmp/sy_attack_1' FIELDS TERMINATED BY ','",
        "SELECT LOAD_FILE('/etc/passwd')",
        "SELECT HEX(LOAD_FILE('/etc/shadow'))",
        "SELECT LOAD_FILE(0x2f6574632f706173737764)",
        "SELECT LOAD_FILE(CONCAT('/etc/', 'passwd'))",
        "SELECT player_id FROM {t}.players WHERE nickname = LOAD_FILE('/etc/hostname')",
        "SELECT * FROM {t}.players UNION "
        "SELECT LOAD_FILE('/etc/passwd'), 1, 1, 1, 1, 1, 1, 1, 1, 1",
        "SELECT 0x3c3f706870 INTO DUMPFILE '/tmp/sy_attack.php'",
    ),
    *_many(
        "sleep_benchmark_lock", FUNC,
        "SELECT SLEEP(10)",
        "SELECT sLeEp(10)",
        "SELECT/**/SLEEP(10)",
        "SELECT player_id FROM {t}.players WHERE SLEEP(1) = 0",
        "SELECT (SELECT SLEEP(5))",
        "SELECT * FROM (SELECT SLEEP(3)) AS x",
        "SELECT BENCHMARK(1000000000, MD5('x'))",
        "SELECT BENCHMARK(10000000, SHA1('x')) FROM {t}.players",
        "SELECT GET_LOCK('sy_attack', 100)",
        "SELECT RELEASE_LOCK('sy_attack')",
        "SELECT IS_FREE_LOCK('sy_attack')",
        "SELECT IS_USED_LOCK('sy_attack')",
        "SELECT RELEASE_ALL_LOCKS()",
        "SELECT MASTER_POS_WAIT('log', 1, 5)",
        "SELECT IF(1 = 1, SLEEP(5), 0)",
    ),
    *_many(
        "recursive_cte", ("cte.recursive",),
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r",
        "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 100000000) "
        "SELECT MAX(n) FROM r",
        "WITH RECURSIVE a AS (SELECT 1 AS x UNION ALL SELECT x + 1 FROM a, {t}.players) "
        "SELECT COUNT(*) FROM a",
        "SELECT * FROM (WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n FROM r) "
        "SELECT n FROM r) AS d",
        "WITH RECURSIVE r AS (SELECT player_id AS n FROM {t}.players UNION ALL "
        "SELECT n + 1 FROM r) SELECT COUNT(*) FROM r",
    ),
    *_many(
        "system_schema", ("table.system_schema",),
        "SELECT * FROM information_schema.tables",
        "SELECT table_schema, table_name FROM information_schema.columns",
        "SELECT * FROM INFORMATION_SCHEMA.PROCESSLIST",
        "SELECT * FROM information_schema.user_privileges",
        "SELECT * FROM `information_schema`.`SCHEMATA`",
        "SELECT user, password FROM mysql.user",
        "SELECT * FROM mysql.db",
        "SELECT * FROM performance_schema.threads",
        "SELECT * FROM sys.session",
        "SELECT player_id FROM {t}.players WHERE player_id IN (SELECT 1 FROM mysql.user)",
        "SELECT nickname FROM {t}.players UNION SELECT table_name FROM information_schema.tables",
        "SELECT p.nickname FROM {t}.players p JOIN mysql.user u ON 1 = 1",
        "SELECT (SELECT COUNT(*) FROM information_schema.schemata) AS n",
    ),
    *_many(
        "variables", ("syntax.variable", "syntax.into", "statement."),
        "SELECT @@version",
        "SELECT @@datadir",
        "SELECT @@global.secure_file_priv",
        "SELECT @@session.sql_mode",
        "SELECT @@hostname",
        "SELECT @a",
        "SELECT @a := 1",
        "SELECT nickname INTO @v FROM {t}.players LIMIT 1",
        "SELECT player_id FROM {t}.players WHERE level > @x",
        "SELECT player_id FROM {t}.players WHERE level > @@max_connections",
        "SELECT player_id, @rank := @rank + 1 FROM {t}.players",
        "SELECT 1 INTO @x",
    ),
    *_many(
        "locking", ("syntax.lock",),
        "SELECT * FROM {t}.players FOR UPDATE",
        "SELECT * FROM {t}.players LOCK IN SHARE MODE",
        "SELECT * FROM {t}.players FOR SHARE",
        "SELECT * FROM {t}.players FOR UPDATE NOWAIT",
        "SELECT * FROM {t}.players FOR UPDATE SKIP LOCKED",
    ),
    *_many(
        "executable_comment", ("comment.",),
        "SELECT 1 /*!50000 UNION SELECT nickname FROM {o}.players */",
        "SELECT nickname /*!, (SELECT COUNT(*) FROM {ops}.players) */ FROM {t}.players",
        "SELECT 1 /*M!100000 , SLEEP(5) */",
        "SELECT /*+ SET_VAR(max_statement_time = 0) */ COUNT(*) FROM {t}.sessions",
        "SELECT /*+ MAX_EXECUTION_TIME(0) */ COUNT(*) FROM {t}.sessions",
        "SELECT 1 /*!00000 , (SELECT password FROM mysql.user LIMIT 1) */",
    ),
    *_many(
        "other_tenant", TABLE,
        "SELECT * FROM {o}.players",
        "SELECT nickname FROM {o}.players",
        "SELECT SUM(amount_cents) FROM {o}.orders",
        "SELECT * FROM `{o}`.`players`",
        "SELECT p.nickname FROM {t}.players p JOIN {o}.players q ON p.player_id = q.player_id",
        "SELECT day, dau FROM {o}.agg_dau_daily",
        "SELECT COUNT(*) FROM {o}.daily_activity",
        "SELECT * FROM {o}.sessions",
    ),
    *_many(
        "base_table", TABLE,
        "SELECT * FROM {ops}.players",
        "SELECT tenant_id, nickname FROM {ops}.players",
        "SELECT SUM(amount_cents) FROM {pay}.orders",
        "SELECT COUNT(*) FROM {ops}.daily_activity WHERE tenant_id <> 'x'",
        "SELECT v FROM {ops}._meta",
        "SELECT p.nickname FROM {t}.players p JOIN {ops}.players b ON b.player_id = p.player_id",
        "SELECT * FROM {pay}.payments",
        "SELECT * FROM {ops}.agg_dau_daily",
    ),
    *_many(
        "subquery", TABLE,
        "SELECT (SELECT nickname FROM {o}.players LIMIT 1) AS x",
        "SELECT player_id FROM {t}.players WHERE player_id IN "
        "(SELECT player_id FROM {ops}.players)",
        "SELECT 1 FROM {t}.players WHERE EXISTS (SELECT 1 FROM {o}.orders)",
        "SELECT d.n FROM (SELECT nickname AS n FROM {o}.players) AS d",
        "SELECT server_id FROM {t}.players GROUP BY server_id "
        "HAVING COUNT(*) > (SELECT COUNT(*) FROM {o}.players)",
        "SELECT player_id FROM {t}.players ORDER BY (SELECT MAX(level) FROM {ops}.players)",
        "SELECT (SELECT (SELECT (SELECT nickname FROM {o}.players LIMIT 1))) AS deep",
        "SELECT a.player_id FROM {t}.players a JOIN {t}.servers s "
        "ON s.server_id = (SELECT MAX(server_id) FROM {o}.servers)",
    ),
    *_many(
        "cte", TABLE,
        "WITH players AS (SELECT * FROM {o}.players) SELECT * FROM players",
        "WITH daily_activity AS (SELECT * FROM {ops}.daily_activity) "
        "SELECT COUNT(*) FROM daily_activity",
        "WITH x AS (SELECT 1 AS a) SELECT * FROM {o}.x",
        "WITH a AS (SELECT * FROM b), b AS (SELECT * FROM {o}.players) SELECT * FROM a",
        "WITH players AS (SELECT 1 AS a) SELECT * FROM {o}.players",
        "SELECT * FROM (WITH q AS (SELECT nickname FROM {ops}.players) SELECT * FROM q) AS d",
        "WITH t1 AS (SELECT player_id FROM {t}.players), t2 AS (SELECT player_id FROM "
        "{o}.players) SELECT * FROM t1 UNION SELECT * FROM t2",
        "WITH orders AS (SELECT * FROM {pay}.orders) SELECT SUM(amount_cents) FROM orders",
    ),
    *_many(
        "union", TABLE,
        "SELECT nickname FROM {t}.players UNION SELECT nickname FROM {o}.players",
        "SELECT nickname FROM {t}.players UNION ALL SELECT tenant_id FROM {ops}.players",
        "SELECT player_id FROM {t}.players INTERSECT SELECT player_id FROM {o}.players",
        "SELECT player_id FROM {t}.players EXCEPT SELECT player_id FROM {o}.players",
        "(SELECT nickname FROM {t}.players) UNION (SELECT nickname FROM {o}.players)",
        "SELECT * FROM (SELECT nickname FROM {t}.players UNION SELECT nickname FROM {ops}.players)"
        " AS u",
        "SELECT 1 FROM {t}.players WHERE player_id IN (SELECT 1 UNION SELECT player_id FROM "
        "{o}.players)",
        "SELECT day FROM {t}.agg_dau_daily UNION SELECT day FROM {o}.agg_dau_daily",
    ),
    *_many(
        "unicode", ("input.", "parse.", "table."),
        "SELECT 1\uff1b DROP TABLE {t}.players",
        "\uff33\uff25\uff2c\uff25\uff23\uff34 1",
        "S\u0415LECT 1",
        "SELECT * FROM {t}.pl\u0430yers",
        "SEL\u200bECT 1",
        "SELECT nickname\u200d FROM {t}.players",
        "\ufeffSELECT 1",
        "SELECT 1\x00; DROP TABLE {t}.players",
        "SELECT '\u202e' AS x",
        "SELECT\u00a01",
        "SELECT\u30001",
        "SELECT 1\u2028; DROP TABLE {t}.players",
        "SELECT nickname FROM {t}.players WHERE nickname = \uff07x\uff07",
        "SELECT nickname FROM {t}.players WHERE nickname = 'x'\u037e DROP TABLE {t}.players",
        "SELECT * FROM `{o}`.`pl\u0430yers`",
        "SELECT * FROM `t_\u0430cme`.players",
    ),
    *_many(
        "enormous", ("input.", "parse.", "syntax.too_deep"),
        "SELECT " + "1 + " * 6000 + "1",
        "SELECT " + "(" * 5000 + "1" + ")" * 5000,
        "SELECT " + "NOT " * 3000 + "1",
        "SELECT " + "CASE WHEN 1 THEN " * 200 + "1" + " END" * 200,
        "SELECT 1 FROM {t}.players WHERE player_id IN (" + ", ".join(["1"] * 6000) + ")",
        "SELECT " + "(SELECT " * 120 + "1" + ")" * 120,
        " UNION ".join(["SELECT 1"] * 3000),
        "SELECT '" + "x" * 70000 + "'",
        "SELECT 1 " + "/* padding */ " * 2000,
    ),
    *_many(
        "limit_bypass", ("limit.",),
        "SELECT * FROM {t}.players",
        "SELECT * FROM {t}.players LIMIT 100000000",
        "SELECT * FROM {t}.players LIMIT 5, 99999999",
        "SELECT * FROM {t}.players LIMIT 18446744073709551615",
        "SELECT * FROM {t}.players LIMIT 1e9",
        "SELECT nickname FROM {t}.players UNION ALL SELECT nickname FROM {t}.players",
        "SELECT * FROM (SELECT * FROM {t}.players LIMIT 5) AS d",
        "SELECT * FROM {t}.players LIMIT 10 OFFSET 1e3",
        strict=True,
    ),
    *_many(
        "limit_bypass", ("syntax.", "limit.", "parse."),
        "SELECT * FROM {t}.players LIMIT @x",
        "SELECT * FROM {t}.players LIMIT ?",
        "SELECT * FROM {t}.players LIMIT 10 OFFSET @o",
        "SELECT * FROM {t}.players LIMIT 0x7fffffff",
        db=True,
    ),
    *_many(
        "function", ("syntax.", "table."),
        "SELECT USER()",
        "SELECT CURRENT_USER()",
        "SELECT DATABASE()",
        "SELECT VERSION()",
        "SELECT CONNECTION_ID()",
        "SELECT EXTRACTVALUE(1, CONCAT(0x7e, (SELECT COUNT(*) FROM {t}.players)))",
        "SELECT UPDATEXML(1, CONCAT(0x7e, 'x'), 1)",
        "SELECT NAME_CONST('a', 1)",
        "SELECT PASSWORD('x')",
        "SELECT SYS_EXEC('id')",
        "SELECT * FROM JSON_TABLE('[1]', '$[*]' COLUMNS (a INT PATH '$')) AS j",
        "SELECT {t}.f(1)",
        "SELECT LAST_INSERT_ID()",
        "SELECT ROW_COUNT()",
        "SELECT REPEAT('x', 100000000)",
        "SELECT player_id FROM {t}.players USE INDEX (PRIMARY)",
        "SELECT player_id FROM {t}.players PARTITION (p0)",
        "SELECT player_id FROM {t}.players NATURAL JOIN {t}.servers",
        "SELECT SQL_CALC_FOUND_ROWS player_id FROM {t}.players",
        "SELECT * FROM (VALUES (1), (2)) AS v",
    ),
]  # fmt: skip
