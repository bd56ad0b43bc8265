"""The demo game-company databases: `game_ops` (servers, players, activity, sessions,
level funnel, events) and `game_pay` (orders, payments, tiers, refunds), plus the
pre-aggregated tables for the top metrics (DAU, retention, revenue by day x server
x channel).

Rows that belong to a studio carry `tenant_id`; a tenant's view of a table drops
that column and filters on it. DDL is plain enough for MariaDB 10.5+ and MySQL 8.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TENANT = "tenant_id VARCHAR(64) NOT NULL"


@dataclass(frozen=True)
class TableSpec:
    db: Literal["ops", "pay"]
    name: str
    body: str  # the column and index list of CREATE TABLE
    columns: tuple[str, ...]  # what a tenant's view exposes (never tenant_id)
    tenant_scoped: bool = True


TABLES: tuple[TableSpec, ...] = (
    TableSpec(
        "ops", "regions",
        "region_id TINYINT NOT NULL PRIMARY KEY, code VARCHAR(16) NOT NULL, "
        "name VARCHAR(64) NOT NULL, timezone VARCHAR(32) NOT NULL",
        ("region_id", "code", "name", "timezone"), tenant_scoped=False,
    ),
    TableSpec(
        "ops", "servers",
        f"{TENANT}, server_id SMALLINT NOT NULL, region_id TINYINT NOT NULL, "
        "name VARCHAR(64) NOT NULL, opened_on DATE NOT NULL, PRIMARY KEY (tenant_id, server_id)",
        ("server_id", "region_id", "name", "opened_on"),
    ),
    TableSpec(
        "ops", "players",
        f"{TENANT}, player_id INT NOT NULL, nickname VARCHAR(96) NOT NULL, "
        "server_id SMALLINT NOT NULL, channel VARCHAR(24) NOT NULL, country CHAR(2) NOT NULL, "
        "device VARCHAR(16) NOT NULL, registered_on DATE NOT NULL, last_login_on DATE NULL, "
        "level SMALLINT NOT NULL, is_payer TINYINT NOT NULL, "
        "PRIMARY KEY (tenant_id, player_id), KEY by_registration (tenant_id, registered_on)",
        ("player_id", "nickname", "server_id", "channel", "country", "device", "registered_on",
         "last_login_on", "level", "is_payer"),
    ),
    TableSpec(
        "ops", "daily_activity",
        f"{TENANT}, day DATE NOT NULL, player_id INT NOT NULL, server_id SMALLINT NOT NULL, "
        "channel VARCHAR(24) NOT NULL, sessions TINYINT NOT NULL, minutes SMALLINT NOT NULL, "
        "max_level SMALLINT NOT NULL, PRIMARY KEY (tenant_id, day, player_id), "
        "KEY by_player (tenant_id, player_id, day)",
        ("day", "player_id", "server_id", "channel", "sessions", "minutes", "max_level"),
    ),
    TableSpec(
        "ops", "sessions",
        f"session_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, {TENANT}, "
        "player_id INT NOT NULL, server_id SMALLINT NOT NULL, started_at DATETIME NOT NULL, "
        "duration_s INT NOT NULL, device VARCHAR(16) NOT NULL, "
        "KEY by_player (tenant_id, player_id)",
        ("session_id", "player_id", "server_id", "started_at", "duration_s", "device"),
    ),
    TableSpec(
        "ops", "level_funnel",
        f"{TENANT}, server_id SMALLINT NOT NULL, level SMALLINT NOT NULL, "
        "players_reached INT NOT NULL, players_completed INT NOT NULL, "
        "PRIMARY KEY (tenant_id, server_id, level)",
        ("server_id", "level", "players_reached", "players_completed"),
    ),
    TableSpec(
        "ops", "events",
        f"{TENANT}, event_id INT NOT NULL, name VARCHAR(96) NOT NULL, kind VARCHAR(24) NOT NULL, "
        "starts_on DATE NOT NULL, ends_on DATE NOT NULL, budget_cents BIGINT NOT NULL, "
        "PRIMARY KEY (tenant_id, event_id)",
        ("event_id", "name", "kind", "starts_on", "ends_on", "budget_cents"),
    ),
    TableSpec(
        "ops", "agg_dau_daily",
        f"{TENANT}, day DATE NOT NULL, server_id SMALLINT NOT NULL, channel VARCHAR(24) NOT NULL, "
        "dau INT NOT NULL, new_players INT NOT NULL, sessions INT NOT NULL, "
        "minutes BIGINT NOT NULL, PRIMARY KEY (tenant_id, day, server_id, channel)",
        ("day", "server_id", "channel", "dau", "new_players", "sessions", "minutes"),
    ),
    TableSpec(
        "ops", "agg_retention",
        f"{TENANT}, cohort_day DATE NOT NULL, server_id SMALLINT NOT NULL, "
        "channel VARCHAR(24) NOT NULL, cohort_size INT NOT NULL, d1 INT NOT NULL, "
        "d7 INT NOT NULL, d30 INT NOT NULL, "
        "PRIMARY KEY (tenant_id, cohort_day, server_id, channel)",
        ("cohort_day", "server_id", "channel", "cohort_size", "d1", "d7", "d30"),
    ),
    TableSpec(
        "pay", "pay_tiers",
        "tier_id TINYINT NOT NULL PRIMARY KEY, name VARCHAR(32) NOT NULL, "
        "price_cents INT NOT NULL, currency CHAR(3) NOT NULL",
        ("tier_id", "name", "price_cents", "currency"), tenant_scoped=False,
    ),
    TableSpec(
        "pay", "orders",
        f"order_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, {TENANT}, "
        "player_id INT NOT NULL, server_id SMALLINT NOT NULL, channel VARCHAR(24) NOT NULL, "
        "tier_id TINYINT NOT NULL, created_at DATETIME NOT NULL, amount_cents INT NOT NULL, "
        "currency CHAR(3) NOT NULL, status VARCHAR(16) NOT NULL, "
        "KEY by_time (tenant_id, created_at), KEY by_player (tenant_id, player_id)",
        ("order_id", "player_id", "server_id", "channel", "tier_id", "created_at",
         "amount_cents", "currency", "status"),
    ),
    TableSpec(
        "pay", "payments",
        f"payment_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, {TENANT}, "
        "order_id BIGINT NOT NULL, provider VARCHAR(16) NOT NULL, paid_at DATETIME NOT NULL, "
        "amount_cents INT NOT NULL, status VARCHAR(16) NOT NULL, "
        "KEY by_order (tenant_id, order_id)",
        ("payment_id", "order_id", "provider", "paid_at", "amount_cents", "status"),
    ),
    TableSpec(
        "pay", "refunds",
        f"refund_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, {TENANT}, "
        "order_id BIGINT NOT NULL, refunded_at DATETIME NOT NULL, amount_cents INT NOT NULL, "
        "reason VARCHAR(32) NOT NULL, KEY by_order (tenant_id, order_id)",
        ("refund_id", "order_id", "refunded_at", "amount_cents", "reason"),
    ),
    TableSpec(
        "pay", "agg_revenue_daily",
        f"{TENANT}, day DATE NOT NULL, server_id SMALLINT NOT NULL, channel VARCHAR(24) NOT NULL, "
        "orders INT NOT NULL, payers INT NOT NULL, revenue_cents BIGINT NOT NULL, "
        "refunds_cents BIGINT NOT NULL, PRIMARY KEY (tenant_id, day, server_id, channel)",
        ("day", "server_id", "channel", "orders", "payers", "revenue_cents", "refunds_cents"),
    ),
)  # fmt: skip

BY_NAME = {t.name: t for t in TABLES}
