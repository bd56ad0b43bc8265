"""Administrative connections (root-like DSN) for the operator CLI and tests."""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import unquote, urlparse

import pymysql

from switchyard.sqldb.flavour import Flavour
from switchyard.sqldb.tls import pymysql_tls, require_encrypted


def dsn_params(dsn: str) -> dict[str, Any]:
    u = urlparse(dsn)
    if u.scheme not in ("mysql", "mariadb"):
        raise ValueError(f"DSN {dsn!r} must start with mysql:// or mariadb://")
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": unquote(u.username or "root"),
        "password": unquote(u.password or ""),
    }


def connect_admin(
    dsn: str, tls: ssl.SSLContext | None = None, **kw: Any
) -> pymysql.connections.Connection[Any]:
    """The admin connection; over verified TLS with `tls` (see `sqldb.tls`), else plaintext."""
    params = dsn_params(dsn)
    conn = pymysql.connect(
        **params, autocommit=True, charset="utf8mb4", connect_timeout=5, **pymysql_tls(tls), **kw
    )
    require_encrypted(conn, tls, f"the database at {params['host']}:{params['port']}")
    return conn


def flavour_of(conn: pymysql.connections.Connection[Any]) -> Flavour:
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        row = cur.fetchone()
    return Flavour.from_version(str(row[0]) if row else "")


def quote_name(name: str) -> str:
    """A backquoted identifier; names come from settings patterns, this is belt and braces."""
    return "`" + name.replace("`", "``") + "`"
