"""`sy sql demo-db`: generate the demo game-company databases, idempotently.

Everything is generated inside the server with `INSERT ... SELECT` over a
numbers table, so hundreds of thousands of rows take seconds and no row
crosses the network. Values are pseudo-random but deterministic (CRC32 of a
tag and the row's keys): the same sizes give the same data. Activity follows
a retention curve (every player plays on registration day, then less and
less, more so for engaged players), sessions and orders follow activity, and
the pre-aggregated tables are computed from the raw ones, so a question asked
of either gives the same answer.

Idempotent: a `_meta` table records a fingerprint of the sizes; a second run
with the same sizes changes nothing, other sizes rebuild the tables. A
database that exists without our `_meta` is refused rather than touched.
"""

# ruff: noqa: S608 - the SQL here is built from settings-validated names and typed
# numbers (patterns in settings.py); no text from a request or a tenant reaches it.

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import pymysql

from switchyard.sqldb.admin import quote_name as q
from switchyard.sqldb.catalog import TABLES
from switchyard.sqldb.naming import check_tenant
from switchyard.sqldb.settings import DemoSettings

GENERATOR_VERSION = 1
CHANNELS = ("organic", "ads_google", "ads_tiktok", "store_feature", "referral")
REGIONS = (
    (1, "cn-east", "China East", "Asia/Shanghai"),
    (2, "cn-south", "China South", "Asia/Shanghai"),
    (3, "sea", "Southeast Asia", "Asia/Singapore"),
    (4, "na", "North America", "America/Los_Angeles"),
    (5, "eu", "Europe", "Europe/Berlin"),
)
TIERS = (
    (1, "starter", 99, "USD"),
    (2, "small", 499, "USD"),
    (3, "medium", 999, "USD"),
    (4, "large", 2999, "USD"),
    (5, "huge", 4999, "USD"),
    (6, "whale", 9999, "USD"),
)
INTERNAL = ("_meta", "_seq", "_digits", "_tenants")


class DemoError(RuntimeError):
    pass


@dataclass
class DemoReport:
    ops_db: str
    pay_db: str
    action: str  # "created", "rebuilt" or "unchanged"
    seconds: float
    rows: dict[str, int] = field(default_factory=dict)


def fingerprint(s: DemoSettings) -> str:
    body = {
        "v": GENERATOR_VERSION,
        "tenants": s.sql_demo_tenants,
        "players": s.sql_demo_players,
        "days": s.sql_demo_days,
        "servers": s.sql_demo_servers,
        "start": s.sql_demo_start.isoformat(),
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]


def _analyze(cur: Any, table: str) -> None:
    # Fresh tables have no statistics; without them the joins below pick nested full
    # scans (30 s instead of 0.3 s at test size).
    cur.execute(f"ANALYZE TABLE {table}")
    cur.fetchall()


def _tables_of(cur: Any, db: str) -> set[str]:
    cur.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s", (db,))
    return {str(r[0]) for r in cur.fetchall()}


def _current_fingerprint(cur: Any, ops: str) -> str | None:
    try:
        cur.execute(f"SELECT v FROM {q(ops)}._meta WHERE k = 'fingerprint'")
    except pymysql.err.ProgrammingError:
        return None
    row = cur.fetchone()
    return str(row[0]) if row else None


def _check_ownership(cur: Any, ops: str, pay: str) -> bool:
    """True when the databases exist and are ours; refuse foreign ones."""
    ops_tables, pay_tables = _tables_of(cur, ops), _tables_of(cur, pay)
    if (ops_tables or pay_tables) and "_meta" not in ops_tables:
        raise DemoError(
            f"{ops}/{pay} exist with tables but were not made by `sy sql demo-db` "
            "(no _meta); choose another SY_SQL_DEMO_PREFIX"
        )
    return bool(ops_tables)


def generate(conn: Any, ops: str, pay: str, s: DemoSettings) -> DemoReport:
    for tenant in s.sql_demo_tenants:
        check_tenant(tenant)
    started = time.monotonic()
    lock = f"sy-demo-db:{ops}"
    with conn.cursor() as cur:
        cur.execute("SELECT GET_LOCK(%s, 600)", (lock,))
        try:
            existed = _check_ownership(cur, ops, pay)
            wanted = fingerprint(s)
            if existed and _current_fingerprint(cur, ops) == wanted:
                return DemoReport(
                    ops, pay, "unchanged", time.monotonic() - started, row_counts(cur, ops, pay)
                )
            _build(cur, ops, pay, s)
            cur.execute(
                f"REPLACE INTO {q(ops)}._meta (k, v) VALUES ('fingerprint', %s), "
                "('generated_at', %s)",
                (wanted, dt.datetime.now(dt.UTC).isoformat()),
            )
            action = "rebuilt" if existed else "created"
            return DemoReport(
                ops, pay, action, time.monotonic() - started, row_counts(cur, ops, pay)
            )
        finally:
            cur.execute("SELECT RELEASE_LOCK(%s)", (lock,))


def row_counts(cur: Any, ops: str, pay: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for spec in TABLES:
        db = ops if spec.db == "ops" else pay
        cur.execute(f"SELECT COUNT(*) FROM {q(db)}.{q(spec.name)}")
        out[spec.name] = int(cur.fetchone()[0])
    return out


def drop(conn: Any, ops: str, pay: str) -> None:
    """Remove the demo databases (only if they carry our `_meta`)."""
    with conn.cursor() as cur:
        if _check_ownership(cur, ops, pay) or _tables_of(cur, pay) == set():
            cur.execute(f"DROP DATABASE IF EXISTS {q(ops)}")
            cur.execute(f"DROP DATABASE IF EXISTS {q(pay)}")


def _build(cur: Any, ops: str, pay: str, s: DemoSettings) -> None:
    od, pd = q(ops), q(pay)  # short names keep the SQL below readable
    cur.execute(f"CREATE DATABASE IF NOT EXISTS {od} CHARACTER SET utf8mb4")
    cur.execute(f"CREATE DATABASE IF NOT EXISTS {pd} CHARACTER SET utf8mb4")
    for spec in TABLES:
        db = od if spec.db == "ops" else pd
        cur.execute(f"DROP TABLE IF EXISTS {db}.{q(spec.name)}")
        cur.execute(f"CREATE TABLE {db}.{q(spec.name)} ({spec.body}) ENGINE=InnoDB")
    for name in INTERNAL:
        cur.execute(f"DROP TABLE IF EXISTS {od}.{q(name)}")
    cur.execute(f"CREATE TABLE {od}._meta (k VARCHAR(64) PRIMARY KEY, v VARCHAR(255) NOT NULL)")
    cur.execute(f"CREATE TABLE {od}._digits (d TINYINT NOT NULL PRIMARY KEY)")
    cur.execute(f"INSERT INTO {od}._digits VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)")
    cur.execute(f"CREATE TABLE {od}._seq (n INT NOT NULL PRIMARY KEY)")
    need = max(s.sql_demo_players, s.sql_demo_days + 31, 100)
    digits = len(str(need - 1))
    terms = " + ".join(f"d{i}.d * {10**i}" for i in range(digits))
    joins = ", ".join(f"{od}._digits d{i}" for i in range(digits))
    cur.execute(f"INSERT INTO {od}._seq SELECT {terms} FROM {joins} WHERE {terms} < {int(need)}")

    # Tenants: weights n, n-1, ..., 1 over `player_id % W` buckets.
    tenants = s.sql_demo_tenants
    cur.execute(
        f"CREATE TABLE {od}._tenants (idx TINYINT PRIMARY KEY, tenant_id VARCHAR(64) NOT NULL, "
        "lo INT NOT NULL, hi INT NOT NULL)",
    )
    lo, rows = 0, []
    for i, tenant in enumerate(tenants):
        weight = len(tenants) - i
        rows.append((i + 1, tenant, lo, lo + weight - 1))
        lo += weight
    buckets = lo
    cur.executemany(f"INSERT INTO {od}._tenants VALUES (%s, %s, %s, %s)", rows)

    # Literals are inlined (typed settings: a date and ints): with driver parameters,
    # every `%` modulo below would have to be written `%%`.
    start = f"'{s.sql_demo_start.isoformat()}'"
    days, servers, players = int(s.sql_demo_days), int(s.sql_demo_servers), int(s.sql_demo_players)
    cur.executemany(f"INSERT INTO {od}.regions VALUES (%s, %s, %s, %s)", REGIONS)
    cur.executemany(f"INSERT INTO {pd}.pay_tiers VALUES (%s, %s, %s, %s)", TIERS)
    cur.execute(
        f"""INSERT INTO {od}.servers
        SELECT t.tenant_id, t.idx * 100 + s.n + 1, 1 + s.n % {len(REGIONS)},
               CONCAT(UPPER(t.tenant_id), '-S', s.n + 1),
               DATE_SUB({start}, INTERVAL (400 - s.n * 25) DAY)
        FROM {od}._tenants t JOIN {od}._seq s ON s.n < {servers}""",
    )
    channel_elt = ", ".join(f"'{c}'" for c in ("organic",) * 4 + CHANNELS[1:2] * 2
                            + CHANNELS[2:3] * 2 + CHANNELS[3:])  # fmt: skip
    cur.execute(
        f"""INSERT INTO {od}.players
        SELECT t.tenant_id, s.n + 1, CONCAT(t.tenant_id, '_player_', s.n + 1),
               t.idx * 100 + 1 + CRC32(CONCAT('srv', s.n)) % {servers},
               ELT(1 + CRC32(CONCAT('ch', s.n)) % 10, {channel_elt}),
               ELT(1 + CRC32(CONCAT('cc', s.n)) % 8,
                   'CN', 'CN', 'CN', 'JP', 'KR', 'US', 'TH', 'VN'),
               ELT(1 + CRC32(CONCAT('dv', s.n)) % 3, 'android', 'android', 'ios'),
               DATE_ADD(DATE_SUB({start}, INTERVAL 30 DAY),
                        INTERVAL CRC32(CONCAT('rg', s.n)) % {days + 30} DAY),
               NULL, 1, CRC32(CONCAT('py', s.n)) % 100 < 10
        FROM {od}._seq s JOIN {od}._tenants t ON s.n % {buckets} BETWEEN t.lo AND t.hi
        WHERE s.n < {players}""",
    )
    _analyze(cur, f"{od}.players")
    _analyze(cur, f"{od}._seq")
    # Activity: certain on registration day, then a retention curve scaled by the
    # player's engagement e in [0, 1).
    # GREATEST: the server may evaluate this before the join condition drops day < registration.
    age = f"GREATEST(0, DATEDIFF(DATE_ADD({start}, INTERVAL d.n DAY), p.registered_on))"
    eng = "(CRC32(CONCAT('en', p.player_id)) % 100) / 100"
    cur.execute(
        f"""INSERT INTO {od}.daily_activity
        SELECT p.tenant_id, DATE_ADD({start}, INTERVAL d.n DAY), p.player_id, p.server_id,
               p.channel,
               1 + CRC32(CONCAT('ss', p.player_id, '/', d.n)) % (1 + FLOOR(3 * {eng})),
               (1 + CRC32(CONCAT('ss', p.player_id, '/', d.n)) % (1 + FLOOR(3 * {eng})))
                 * (4 + CRC32(CONCAT('mn', p.player_id, '/', d.n)) % 35),
               LEAST(60, 1 + FLOOR(SQRT({age}) * (1 + 4 * {eng})))
        FROM {od}.players p JOIN {od}._seq d
          ON d.n < {days} AND DATE_ADD({start}, INTERVAL d.n DAY) >= p.registered_on
        WHERE CRC32(CONCAT(p.player_id, '/', d.n)) % 10000 <
              CASE WHEN {age} = 0 THEN 10000
                   ELSE 10000 * (0.06 + 0.6 * {eng}) * (0.3 + 0.7 / (1 + {age} / 4)) END""",
    )
    _analyze(cur, f"{od}.daily_activity")
    cur.execute(
        f"""UPDATE {od}.players p JOIN (
              SELECT tenant_id, player_id, MAX(max_level) AS lv, MAX(day) AS last
              FROM {od}.daily_activity GROUP BY tenant_id, player_id) x
            ON x.tenant_id = p.tenant_id AND x.player_id = p.player_id
        SET p.level = x.lv, p.last_login_on = x.last""",
    )
    cur.execute(
        f"""INSERT INTO {od}.sessions (tenant_id, player_id, server_id, started_at, duration_s,
                                      device)
        SELECT a.tenant_id, a.player_id, a.server_id,
               TIMESTAMPADD(SECOND, CRC32(CONCAT('st', a.player_id, a.day, k.n)) % 86000, a.day),
               60 * a.minutes DIV a.sessions + CRC32(CONCAT('du', a.player_id, a.day, k.n)) % 120,
               p.device
        FROM {od}.daily_activity a
        JOIN {od}._seq k ON k.n < a.sessions
        JOIN {od}.players p ON p.tenant_id = a.tenant_id AND p.player_id = a.player_id""",
    )
    cur.execute(
        f"""INSERT INTO {od}.level_funnel
        SELECT p.tenant_id, p.server_id, l.n, COUNT(*), SUM(p.level > l.n)
        FROM {od}.players p JOIN {od}._seq l ON l.n BETWEEN 1 AND 60 AND l.n <= p.level
        GROUP BY p.tenant_id, p.server_id, l.n""",
    )
    cur.execute(
        f"""INSERT INTO {od}.events
        SELECT t.tenant_id, s.n + 1,
               CONCAT(ELT(1 + s.n % 6, 'Spring', 'Lunar', 'Summer', 'Anniversary', 'Winter',
                          'Guild'), ' ',
                      ELT(1 + s.n % 5, 'Festival', 'Gacha', 'PvP Cup', 'Login Bonus', 'Raid')),
               ELT(1 + s.n % 5, 'festival', 'gacha', 'pvp', 'login_bonus', 'raid'),
               DATE_ADD({start}, INTERVAL (s.n * 7 - 20) DAY),
               DATE_ADD({start}, INTERVAL (s.n * 7 - 15 + s.n % 7) DAY),
               100000 * (1 + s.n % 9)
        FROM {od}._tenants t JOIN {od}._seq s ON s.n < 12""",
    )
    cur.execute(
        f"""INSERT INTO {od}.agg_dau_daily
        SELECT a.tenant_id, a.day, a.server_id, a.channel, COUNT(*),
               SUM(a.day = p.registered_on), SUM(a.sessions), SUM(a.minutes)
        FROM {od}.daily_activity a
        JOIN {od}.players p ON p.tenant_id = a.tenant_id AND p.player_id = a.player_id
        GROUP BY a.tenant_id, a.day, a.server_id, a.channel""",
    )
    retained = (
        "LEFT JOIN {od}.daily_activity {a} ON {a}.tenant_id = p.tenant_id "
        "AND {a}.player_id = p.player_id AND {a}.day = DATE_ADD(p.registered_on, INTERVAL {d} DAY)"
    )
    cur.execute(
        f"""INSERT INTO {od}.agg_retention
        SELECT p.tenant_id, p.registered_on, p.server_id, p.channel, COUNT(*),
               COUNT(r1.player_id), COUNT(r7.player_id), COUNT(r30.player_id)
        FROM {od}.players p
        {retained.format(od=od, a="r1", d=1)}
        {retained.format(od=od, a="r7", d=7)}
        {retained.format(od=od, a="r30", d=30)}
        WHERE p.registered_on >= {start}
        GROUP BY p.tenant_id, p.registered_on, p.server_id, p.channel""",
    )
    # Orders: payers buy on a quarter of their active days, others rarely.
    cur.execute(
        f"""INSERT INTO {pd}.orders (tenant_id, player_id, server_id, channel, tier_id, created_at,
                                    amount_cents, currency, status)
        SELECT o.tenant_id, o.player_id, o.server_id, o.channel, o.tier_id, o.created_at,
               t.price_cents, t.currency,
               CASE WHEN o.r < 93 THEN 'paid' WHEN o.r < 98 THEN 'failed' ELSE 'refunded' END
        FROM (
          SELECT a.tenant_id, a.player_id, a.server_id, a.channel,
                 ELT(1 + CRC32(CONCAT('tr', a.player_id, a.day)) % 20,
                     1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 4, 4, 5, 6) AS tier_id,
                 TIMESTAMPADD(SECOND, CRC32(CONCAT('ot', a.player_id, a.day)) % 86000, a.day)
                   AS created_at,
                 CRC32(CONCAT('os', a.player_id, a.day)) % 100 AS r
          FROM {od}.daily_activity a
          JOIN {od}.players p ON p.tenant_id = a.tenant_id AND p.player_id = a.player_id
          WHERE CRC32(CONCAT('od', a.player_id, '/', a.day)) % 1000 < IF(p.is_payer, 250, 4)
        ) o JOIN {pd}.pay_tiers t ON t.tier_id = o.tier_id
        ORDER BY o.created_at""",
    )
    cur.execute(
        f"""INSERT INTO {pd}.payments (tenant_id, order_id, provider, paid_at, amount_cents, status)
        SELECT tenant_id, order_id,
               ELT(1 + CRC32(CONCAT('pv', order_id)) % 4, 'apple', 'google', 'wechat', 'card'),
               TIMESTAMPADD(SECOND, 3 + CRC32(CONCAT('pd', order_id)) % 30, created_at),
               amount_cents, IF(status = 'failed', 'declined', 'captured')
        FROM {pd}.orders ORDER BY order_id""",
    )
    cur.execute(
        f"""INSERT INTO {pd}.refunds (tenant_id, order_id, refunded_at, amount_cents, reason)
        SELECT tenant_id, order_id,
               TIMESTAMPADD(HOUR, 1 + CRC32(CONCAT('rf', order_id)) % 72, created_at),
               amount_cents,
               ELT(1 + CRC32(CONCAT('rr', order_id)) % 3, 'accidental', 'fraud', 'complaint')
        FROM {pd}.orders WHERE status = 'refunded' ORDER BY order_id""",
    )
    cur.execute(
        f"""INSERT INTO {pd}.agg_revenue_daily
        SELECT tenant_id, DATE(created_at), server_id, channel, COUNT(*),
               COUNT(DISTINCT player_id), SUM(amount_cents),
               SUM(IF(status = 'refunded', amount_cents, 0))
        FROM {pd}.orders WHERE status IN ('paid', 'refunded')
        GROUP BY tenant_id, DATE(created_at), server_id, channel""",
    )
    for spec in TABLES:
        _analyze(cur, f"{od if spec.db == 'ops' else pd}.{q(spec.name)}")
