"""Settings of the SQL side: the guard (signing key, policies), the database walls,
the executor's limits and the demo data sizes. Env prefix `SY_`, e.g.
`SY_SQL_SIGNING_KEY`, `SY_SQL_DB_SECRET`, `SY_SQL_STATEMENT_TIMEOUT`.

The validator gets only `GuardSettings`; database secrets live in
`DatabaseSettings`, which only the executor and the operator CLI load.
"""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import Field, SecretStr, model_validator

from switchyard.config import Settings
from switchyard.sqldb.naming import Naming

_NAME_PREFIX = r"^[a-z0-9_]{0,20}$"


LOCAL_SIGNING_KEY = "changeme-local-signing-key"


class GuardSettings(Settings):
    # HMAC key shared by the validator (signs) and the executor (verifies).
    sql_signing_key: SecretStr = SecretStr(LOCAL_SIGNING_KEY)
    # One `<tenant>.yaml` policy per tenant, written by `sy sql provision`.
    sql_policy_dir: Path = Path(".sy/sql-policies")

    @model_validator(mode="after")
    def _real_signing_key(self) -> GuardSettings:
        # The local default is long enough for HMAC, so the base class's placeholder
        # check would let it through: refuse it (and short keys) outside local.
        key = self.sql_signing_key.get_secret_value()
        if self.env != "local" and (key == LOCAL_SIGNING_KEY or len(key) < 32):
            raise ValueError("SY_SQL_SIGNING_KEY must be a real key of 32+ characters")
        return self


class DatabaseSettings(Settings):
    mysql_host: str = "127.0.0.1"
    mysql_port: int = Field(default=3306, ge=1, le=65535)
    # TLS to the database (see `sqldb.tls`): with a CA, every connection requires TLS and
    # verifies the server's certificate against it and `mysql_host`; without, plaintext.
    # A client certificate (cert + key) for accounts made with REQUIRE X509 or stricter.
    mysql_ssl_ca: Path | None = None
    mysql_ssl_cert: Path | None = None
    mysql_ssl_key: Path | None = None
    # Every account password is derived from this secret (HMAC of the account name),
    # so the executor and `sy sql provision` agree without a password file. None only
    # for the auditor, which has its own account's password instead.
    sql_db_secret: SecretStr | None = SecretStr("changeme")
    # The INSERT-only audit account's own password. Set it (for `sy sql provision` and the
    # auditor alike) and the auditor needs no SY_SQL_DB_SECRET, which would let it derive
    # every tenant account's password; unset, it is derived from the secret like the rest.
    sql_audit_password: SecretStr | None = None
    sql_demo_prefix: str = Field(default="", pattern=_NAME_PREFIX)
    sql_schema_prefix: str = Field(default="t_", pattern=_NAME_PREFIX)
    sql_account_prefix: str = Field(default="sy_", pattern=_NAME_PREFIX)
    sql_account_host: str = Field(default="%", pattern=r"^[A-Za-z0-9.%_:-]{1,60}$")
    sql_audit_db: str = Field(default="sy_audit", pattern=r"^[a-z0-9_]{1,64}$")
    # Caps the database enforces on each tenant account on its own, executor or not.
    sql_max_user_connections: int = Field(default=10, ge=2, le=1000)
    sql_user_statement_seconds: float = Field(default=30.0, gt=0, le=3600)
    sql_planner_statement_seconds: float = Field(default=5.0, gt=0, le=600)

    @model_validator(mode="after")
    def _tls_files(self) -> DatabaseSettings:
        if (self.mysql_ssl_cert is None) != (self.mysql_ssl_key is None):
            raise ValueError("set SY_MYSQL_SSL_CERT and SY_MYSQL_SSL_KEY together")
        if self.mysql_ssl_cert is not None and self.mysql_ssl_ca is None:
            raise ValueError("a client certificate needs SY_MYSQL_SSL_CA (TLS is off without)")
        return self

    def tls_context(self) -> ssl.SSLContext | None:
        """The database connections' TLS context (None: plaintext); reads the files."""
        if self.mysql_ssl_ca is None:
            return None
        ctx = ssl.create_default_context(cafile=str(self.mysql_ssl_ca))  # + check_hostname
        if self.mysql_ssl_cert is not None:
            ctx.load_cert_chain(str(self.mysql_ssl_cert), str(self.mysql_ssl_key))
        return ctx


def auditor_password(settings: DatabaseSettings) -> str:
    """The audit account's password: the explicit one, else derived from the secret."""
    if settings.sql_audit_password is not None:
        return settings.sql_audit_password.get_secret_value()
    names = naming(settings)
    return names.password(names.auditor_user)


class ExecutorLimits(Settings):
    # Per-tenant pool; one more connection per tenant is kept free for KILL QUERY.
    sql_pool_size: int = Field(default=4, ge=1, le=256)
    sql_planner_pool_size: int = Field(default=4, ge=1, le=256)
    # How long a request waits for a pooled connection before it is answered "busy".
    sql_busy_timeout: float = Field(default=0.05, ge=0, le=10)
    sql_statement_timeout: float = Field(default=10.0, gt=0, le=3600)
    # The watchdog KILLs at deadline + grace; the client gives up at deadline + client grace.
    sql_watchdog_grace: float = Field(default=0.25, ge=0, le=10)
    sql_client_grace: float = Field(default=0.75, ge=0, le=10)
    # Off only to prove the watchdog alone stops a runaway query.
    sql_server_timeout: bool = True
    sql_max_rows: int = Field(default=1000, ge=1, le=100_000)
    sql_max_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    sql_explain_gate: bool = True
    # A plan is refused when it scans a large table in full, when its estimated rows
    # examined exceed the cap, or when it sorts or builds a temporary table that big.
    sql_explain_max_rows: int = Field(default=50_000, ge=1)
    sql_explain_large_table_rows: int = Field(default=20_000, ge=1)
    sql_max_inflight: int = Field(default=64, ge=1, le=10_000)


class DemoSettings(Settings):
    sql_demo_tenants: list[str] = ["acme", "nova", "orbit", "zen"]
    sql_demo_players: int = Field(default=100_000, ge=10, le=10_000_000)
    sql_demo_days: int = Field(default=60, ge=2, le=3650)
    sql_demo_servers: int = Field(default=8, ge=1, le=99)
    sql_demo_start: dt.date = dt.date(2025, 1, 1)


class AdminSettings(DatabaseSettings, GuardSettings, DemoSettings):
    """What `sy sql demo-db` and `sy sql provision` read: the admin DSN on top."""

    mysql_dsn: str = "mysql://root@127.0.0.1:3306"
    # The admin account's password when the DSN carries none: from a file in production
    # (SY_MYSQL_ADMIN_PASSWORD_FILE, a Docker or Kubernetes secret), so it is in no env file.
    mysql_admin_password: SecretStr | None = None
    sql_max_limit: int = Field(default=1000, ge=1, le=100_000)
    # Accounts made by `sy sql provision` (tenants, planner, auditor) get REQUIRE SSL: the
    # database itself refuses them in plaintext, whoever holds their passwords.
    sql_require_ssl: bool = False

    def admin_dsn(self) -> str:
        """The DSN to connect with: `mysql_dsn`, given `mysql_admin_password` unless it
        names a password itself."""
        if self.mysql_admin_password is None or urlsplit(self.mysql_dsn).password:
            return self.mysql_dsn
        return _with_password(self.mysql_dsn, self.mysql_admin_password.get_secret_value())

    def shown_dsn(self) -> str:
        """The DSN for a message: no password."""
        if urlsplit(self.mysql_dsn).password is None:
            return self.mysql_dsn
        return _with_password(self.mysql_dsn, "***")


def _with_password(dsn: str, password: str) -> str:
    """`dsn` with `password` (URL-quoted) for its user (root if it names none)."""
    url = urlsplit(dsn)
    host = url.netloc.rpartition("@")[2]
    netloc = f"{url.username or 'root'}:{quote(password, safe='*')}@{host}"
    return urlunsplit(url._replace(netloc=netloc))


def naming(settings: DatabaseSettings) -> Naming:
    return Naming(
        demo_prefix=settings.sql_demo_prefix,
        schema_prefix=settings.sql_schema_prefix,
        account_prefix=settings.sql_account_prefix,
        # No secret (the auditor's settings): names only; `password()` refuses to derive.
        secret=settings.sql_db_secret.get_secret_value().encode()
        if settings.sql_db_secret is not None
        else b"",
    )


class ExecutorConfig(DatabaseSettings, GuardSettings, ExecutorLimits):
    """Everything the executor reads; `services.executor.settings` names it for the service."""
