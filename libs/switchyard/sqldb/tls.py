"""TLS on the MariaDB/MySQL connections of the executor, the auditor and the operator CLI.

One rule for every connection: with `SY_MYSQL_SSL_CA` set, TLS is required and
verified (the server's certificate must chain to that CA and name `SY_MYSQL_HOST`);
without it the connection is plaintext, never "TLS if offered, unverified" (recent
PyMySQL's default when given no TLS options), so what a process does is what its
settings say. A server that offers no TLS to a client holding a CA is refused: no silent
downgrade. The context itself is `DatabaseSettings.tls_context` (the settings module
stays free of the drivers: the validator loads it).

`check_login` is the start-up check: it turns "this database wants TLS and I have no CA"
(which MariaDB answers with a plain "access denied") into `DbTlsError`, so the executor
and the auditor stop at once with a sentence instead of failing every request.
"""

from __future__ import annotations

import ssl
from typing import Any

import pymysql

from switchyard.errors import ErrorCode, SwitchyardError

ACCESS_DENIED = 1045
# Client errors of a failed TLS handshake (2003, the cause an SSLError) and of a server
# offering no TLS to a client that requires it (2026).
TLS_FAILURES = frozenset({2003, 2026})
# The exit status of a service stopped by `DbTlsError` (sysexits' EX_CONFIG): restarting
# it changes nothing until its settings or the database's do.
DB_TLS_EXIT = 78


class DbTlsError(SwitchyardError):
    """The database connection's TLS is misconfigured: the server requires TLS and we have
    no CA, its certificate does not verify, or it offers no TLS while we require it."""

    code: ErrorCode = "db_error"


def pymysql_tls(ctx: ssl.SSLContext | None) -> dict[str, Any]:
    """The TLS arguments of `pymysql.connect`: the context, or TLS off."""
    return {"ssl": ctx} if ctx is not None else {"ssl_disabled": True}


def is_encrypted(conn: Any) -> bool:
    """Whether an open PyMySQL or aiomysql connection runs over TLS, from the client's side
    (the server's word would be worthless against a man in the middle). Private attributes
    of both drivers: should one change, this says False and TLS fails closed."""
    if isinstance(getattr(conn, "_sock", None), ssl.SSLSocket):  # PyMySQL
        return True
    return getattr(conn, "_secure", False) is True  # aiomysql


def require_encrypted(conn: Any, ctx: ssl.SSLContext | None, where: str) -> None:
    """Close `conn` and raise `DbTlsError` if TLS was asked for and the server gave none."""
    if ctx is not None and not is_encrypted(conn):
        conn.close()
        raise DbTlsError(f"{where} offers no TLS, and SY_MYSQL_SSL_CA requires it")


def check_login(host: str, port: int, user: str, password: str, ctx: ssl.SSLContext | None) -> bool:
    """Log in once as `user`, as the service's connections will. True when it works;
    False when the server cannot be reached or refuses the login for a reason other than
    TLS (the database may come up or be provisioned later: requests then fail with
    db_error, as before). Raises `DbTlsError` when TLS is the reason. Blocking."""
    where = f"the database at {host}:{port}"

    def connect(tls: dict[str, Any]) -> Any:
        return pymysql.connect(
            host=host, port=port, user=user, password=password, connect_timeout=5, **tls
        )

    try:
        conn = connect(pymysql_tls(ctx))
    except pymysql.err.OperationalError as exc:
        code = exc.args[0] if exc.args else None
        if ctx is not None and code in TLS_FAILURES and "SSL" in str(exc):
            raise DbTlsError(f"TLS with {where} failed: {exc.args[1]}") from exc
        if ctx is None and code == ACCESS_DENIED and _logs_in_over_tls(connect):
            raise DbTlsError(
                f"{where} requires TLS for {user} (REQUIRE SSL or require_secure_transport) "
                "and SY_MYSQL_SSL_CA is not set: set it to the database's CA certificate"
            ) from exc
        return False
    except ssl.SSLError as exc:
        raise DbTlsError(f"TLS with {where} failed: {exc}") from exc
    require_encrypted(conn, ctx, where)  # closes it when it raises
    conn.close()
    return True


def _logs_in_over_tls(connect: Any) -> bool:
    """Whether the login refused in plaintext works over (unverified) TLS: then the server
    wants TLS, not another password. MariaDB's plain "access denied" does not tell."""
    probe = ssl.create_default_context()
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE  # a diagnosis only: nothing is sent but the login
    try:
        connect({"ssl": probe}).close()
    except (pymysql.err.Error, OSError):
        return False
    return True
