"""Opening an executor connection: one account, a pinned session, its server flavour.

The session is pinned so the canonical SQL means what the validator meant:
sqlglot's MySQL dialect assumes backslash escapes in strings, backquoted
names and `||` as OR, so `sql_mode` leaves out NO_BACKSLASH_ESCAPES,
ANSI_QUOTES and PIPES_AS_CONCAT whatever the server default says; every
transaction is read-only by default; a default statement limit applies even
to a statement that carries none.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

import aiomysql  # type: ignore[import-untyped]

from switchyard.sqldb.flavour import Flavour
from switchyard.sqldb.tls import require_encrypted

SQL_MODE = "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION"


@dataclass(frozen=True)
class Account:
    host: str
    port: int
    user: str
    password: str
    database: str | None = None
    tls: ssl.SSLContext | None = None  # None: plaintext (see `sqldb.tls`)


@dataclass
class DbConnection:
    raw: Any  # aiomysql.Connection
    thread_id: int
    flavour: Flavour

    @property
    def closed(self) -> bool:
        return bool(self.raw.closed)

    def close(self) -> None:
        self.raw.close()


async def open_connection(
    account: Account, *, statement_seconds: float, connect_timeout: float = 5.0
) -> DbConnection:
    raw = await aiomysql.connect(
        host=account.host,
        port=account.port,
        user=account.user,
        password=account.password,
        db=account.database,
        autocommit=True,
        charset="utf8mb4",
        connect_timeout=connect_timeout,
        ssl=account.tls,
    )
    # aiomysql goes on in plaintext when the server offers no TLS: refuse that here.
    require_encrypted(raw, account.tls, f"the database at {account.host}:{account.port}")
    try:
        async with raw.cursor() as cur:
            await cur.execute("SELECT VERSION(), CONNECTION_ID()")
            version, thread_id = await cur.fetchone()
            flavour = Flavour.from_version(str(version))
            await cur.execute(f"SET SESSION sql_mode = '{SQL_MODE}'")
            await cur.execute("SET SESSION TRANSACTION READ ONLY")
            await cur.execute(flavour.session_timeout(statement_seconds))
    except BaseException:
        raw.close()
        raise
    return DbConnection(raw, int(thread_id), flavour)
