"""A private set of demo databases, tenant walls and policies for one test session.

Everything is named with a unique prefix, so parallel runs (and other engineers'
tests on the same server) never see each other's objects, and it is all removed
at the end.
"""

from __future__ import annotations

import secrets
import ssl
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql

from switchyard.messages.sql import ExecuteRequest
from switchyard.sqldb import demo
from switchyard.sqldb.admin import connect_admin
from switchyard.sqldb.admin import quote_name as q
from switchyard.sqldb.naming import Naming
from switchyard.sqldb.provision import _account, provision_auditor, provision_tenant
from switchyard.sqldb.settings import DemoSettings, ExecutorConfig
from switchyard.sqldb.tls import pymysql_tls
from switchyard.sqlguard import PolicyStore, validate
from switchyard.sqlguard.signing import sign

TENANTS = ("acme", "nova")  # provisioned
DEMO_TENANTS = ("acme", "nova", "orbit", "zen")  # in the data, as in the default demo
# Small enough to build in ~2 s, big enough that a full scan is measurably slower
# than the pre-aggregated path (tens of thousands of activity and session rows).
PLAYERS = 6000
DAYS = 40
USER_STATEMENT_SECONDS = 1.0
MAX_USER_CONNECTIONS = 6


@dataclass
class SqlEnv:
    dsn: str
    prefix: str
    naming: Naming
    policy_dir: Path
    db_secret: str
    signing_key: str
    rows: dict[str, int]
    # The CA of a server that wants TLS (`tests.support.tlsdb`): every connection uses it.
    ssl_ca: Path | None = None

    @property
    def tls(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=str(self.ssl_ca)) if self.ssl_ca else None

    @property
    def audit_db(self) -> str:
        return f"{self.prefix}audit"

    def schema(self, tenant: str) -> str:
        return self.naming.tenant_schema(tenant)

    def admin(self) -> Any:
        return connect_admin(self.dsn, self.tls)

    def tenant_conn(self, tenant: str, **kw: Any) -> Any:
        user = self.naming.tenant_user(tenant)
        params = demo_params(self.dsn)
        return pymysql.connect(
            host=params["host"], port=params["port"], user=user,
            password=self.naming.password(user), autocommit=True, connect_timeout=5,
            **pymysql_tls(self.tls), **kw,
        )  # fmt: skip

    def settings(self, cls: type[ExecutorConfig] = ExecutorConfig, **overrides: Any) -> Any:
        params = demo_params(self.dsn)
        values: dict[str, Any] = {
            "mysql_host": params["host"],
            "mysql_port": params["port"],
            "sql_db_secret": self.db_secret,
            "sql_signing_key": self.signing_key,
            "sql_policy_dir": self.policy_dir,
            "sql_demo_prefix": self.prefix,
            "sql_schema_prefix": self.prefix + "t_",
            "sql_account_prefix": self.prefix,
            "mysql_ssl_ca": self.ssl_ca,
            # test-size thresholds: the raw DAU scan (~12k rows of one tenant) is
            # refused, the pre-aggregated table (~1k rows) is not
            "sql_explain_max_rows": 5_000,
            "sql_explain_large_table_rows": 5_000,
            **overrides,
        }
        return cls(**values)

    def policies(self) -> PolicyStore:
        return PolicyStore(self.policy_dir)

    def signed(self, tenant: str, sql: str, **kw: Any) -> ExecuteRequest:
        """What the validator would hand the executor for `sql`."""
        policy = self.policies().get(tenant)
        assert policy is not None and policy.database
        verdict = validate(sql, policy)
        assert verdict.ok and verdict.sql and verdict.policy_version, verdict
        signature = sign(
            self.signing_key.encode(), tenant=tenant, database=policy.database,
            sql=verdict.sql, policy_version=verdict.policy_version,
        )  # fmt: skip
        return ExecuteRequest(
            tenant=tenant, canonical_sql=verdict.sql, database=policy.database,
            policy_version=verdict.policy_version, signature=signature, **kw,
        )  # fmt: skip


def demo_params(dsn: str) -> dict[str, Any]:
    from switchyard.sqldb.admin import dsn_params

    return dsn_params(dsn)


def build(
    dsn: str, policy_dir: Path, *, ssl_ca: Path | None = None, require_ssl: bool = False
) -> SqlEnv:
    """With `ssl_ca` every connection goes over TLS; `require_ssl` makes every account
    REQUIRE SSL."""
    prefix = f"s7{uuid.uuid4().hex[:6]}_"
    naming = Naming(prefix, prefix + "t_", prefix, secrets.token_hex(16).encode())
    env = SqlEnv(
        dsn=dsn, prefix=prefix, naming=naming, policy_dir=policy_dir,
        db_secret=naming.secret.decode(), signing_key=secrets.token_hex(32), rows={},
        ssl_ca=ssl_ca,
    )  # fmt: skip
    conn = env.admin()
    try:
        report = demo.generate(
            conn,
            naming.ops_db,
            naming.pay_db,
            DemoSettings(sql_demo_players=PLAYERS, sql_demo_days=DAYS,
                         sql_demo_tenants=list(DEMO_TENANTS)),
        )  # fmt: skip
        env.rows = report.rows
        for tenant in TENANTS:
            provision_tenant(
                conn, naming, tenant, host="%", max_connections=MAX_USER_CONNECTIONS,
                statement_seconds=USER_STATEMENT_SECONDS, planner_statement_seconds=5,
                policy_dir=policy_dir, max_limit=1000, require_ssl=require_ssl,
            )  # fmt: skip
        provision_auditor(conn, naming, host="%", audit_db=env.audit_db, require_ssl=require_ssl)
    finally:
        conn.close()
    return env


def teardown(env: SqlEnv) -> None:
    conn = env.admin()
    try:
        for tenant in DEMO_TENANTS:  # the bench test provisions one more
            deprovision_tenant(conn, env.naming, tenant, host="%")
        drop_service_accounts(conn, env.naming, host="%", audit_db=env.audit_db)
        demo.drop(conn, env.naming.ops_db, env.naming.pay_db)
    finally:
        conn.close()


def deprovision_tenant(conn: Any, naming: Naming, tenant: str, *, host: str) -> None:
    """Remove a tenant's account and schema (the schema holds only our views)."""
    with conn.cursor() as cur:
        cur.execute(f"DROP USER IF EXISTS {_account(naming.tenant_user(tenant), host)}")
        cur.execute(f"DROP DATABASE IF EXISTS {q(naming.tenant_schema(tenant))}")


def drop_service_accounts(conn: Any, naming: Naming, *, host: str, audit_db: str | None) -> None:
    with conn.cursor() as cur:
        cur.execute(f"DROP USER IF EXISTS {_account(naming.planner_user, host)}")
        cur.execute(f"DROP USER IF EXISTS {_account(naming.auditor_user, host)}")
        if audit_db:
            cur.execute(f"DROP DATABASE IF EXISTS {q(audit_db)}")
