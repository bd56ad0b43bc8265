"""`sy sql provision --tenant T`: the database walls of one tenant, idempotently.

- a schema `<schema_prefix><tenant>` holding one view per demo table, with the
  tenant filter written into the view (`WHERE tenant_id = 'T'`) and the
  `tenant_id` column dropped;
- an account with SELECT on exactly those views (table-level grants, so a view
  added later is not readable until granted), no FILE, no PROCESS, no other
  privilege, `MAX_USER_CONNECTIONS`, and on MariaDB a per-user
  `MAX_STATEMENT_TIME`: the wall holds for anyone holding the credentials,
  executor or not;
- the planner account may EXPLAIN the tenant's views: MariaDB and MySQL refuse
  EXPLAIN on a view without SELECT on the tables under it, and a tenant account
  must never have that, so plans are asked by a separate account used for
  nothing else (SELECT on the demo tables and the views, short statement limit);
- the auditor account: INSERT only, on the append-only audit table;
- the tenant's policy file, listing exactly the views and their columns.

With `require_ssl` every account is made `REQUIRE SSL` (else `REQUIRE NONE`, so
provisioning again without it undoes it): the server refuses its login in plaintext.

Accounts' passwords are derived from `SY_SQL_DB_SECRET` (see `naming`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchyard.sqldb.admin import flavour_of
from switchyard.sqldb.admin import quote_name as q
from switchyard.sqldb.auditchain import AUDIT_TABLE, ensure_chain_schema
from switchyard.sqldb.catalog import TABLES
from switchyard.sqldb.naming import Naming, check_tenant
from switchyard.sqlguard.policy import Policy, dump_policy

AUDIT_DDL = """(
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  at DATETIME(6) NOT NULL,
  request_id VARCHAR(64) NOT NULL,
  tenant VARCHAR(64) NOT NULL,
  event VARCHAR(64) NOT NULL,
  actor VARCHAR(64) NOT NULL,
  verdict VARCHAR(32) NULL,
  rule VARCHAR(64) NULL,
  killed TINYINT NOT NULL DEFAULT 0,
  sql_hash CHAR(64) NULL,
  sql_text MEDIUMTEXT NULL,
  question TEXT NULL,
  plan JSON NULL,
  rows_scanned BIGINT NULL,
  rows_returned BIGINT NULL,
  duration_ms DOUBLE NULL,
  KEY by_tenant_time (tenant, at)
) ENGINE=InnoDB"""


@dataclass
class ProvisionReport:
    tenant: str
    schema: str
    user: str
    views: list[str] = field(default_factory=list)
    policy_path: Path | None = None
    flavour: str = ""


_ACCOUNT_PART = re.compile(r"^[A-Za-z0-9_.%:-]{1,80}$")


def _account(name: str, host: str) -> str:
    for part in (name, host):
        if not _ACCOUNT_PART.match(part):
            raise ValueError(f"unsafe account name part {part!r}")
    return f"'{name}'@'{host}'"


def _require(require_ssl: bool) -> str:
    """The TLS clause of CREATE/ALTER USER (it goes before the WITH of the limits)."""
    return "REQUIRE SSL" if require_ssl else "REQUIRE NONE"


def ensure_user(
    cur: Any, user: str, host: str, password: str, limits: str, require_ssl: bool = False,
    *, revoke: bool = True,
) -> str:  # fmt: skip
    """Create or reset an account (with `revoke`, left with no privileges at all); returns
    its `'u'@'h'`."""
    account = _account(user, host)
    # Literal, not a driver parameter: the host may be '%', which the driver would format.
    secret = cur.connection.escape(password)
    cur.execute(f"CREATE USER IF NOT EXISTS {account} IDENTIFIED BY {secret}")
    cur.execute(f"ALTER USER {account} IDENTIFIED BY {secret} {_require(require_ssl)} {limits}")
    if revoke:
        # Whatever it may have been granted before (by us or by hand) goes first.
        cur.execute(f"REVOKE ALL PRIVILEGES, GRANT OPTION FROM {account}")
    return account


def tenant_views(naming: Naming, tenant: str) -> list[tuple[str, str]]:
    """(view name, SELECT ... of the view) for each demo table."""
    out = []
    for spec in TABLES:
        base = f"{q(naming.ops_db if spec.db == 'ops' else naming.pay_db)}.{q(spec.name)}"
        cols = ", ".join(q(c) for c in spec.columns)
        where = f" WHERE tenant_id = '{tenant}'" if spec.tenant_scoped else ""
        # The tenant id matched check_tenant's pattern: no quote can be in it.
        out.append((spec.name, f"SELECT {cols} FROM {base}{where}"))  # noqa: S608
    return out


def tenant_policy(naming: Naming, tenant: str, max_limit: int) -> Policy:
    schema = naming.tenant_schema(tenant)
    return Policy(
        database=schema,
        max_limit=max_limit,
        exact_columns=True,
        tables={f"{schema}.{spec.name}": list(spec.columns) for spec in TABLES},
    )


def provision_tenant(
    conn: Any,
    naming: Naming,
    tenant: str,
    *,
    host: str,
    max_connections: int,
    statement_seconds: float,
    planner_statement_seconds: float,
    policy_dir: Path | None,
    max_limit: int,
    require_ssl: bool = False,
) -> ProvisionReport:
    check_tenant(tenant)  # the id is written into view definitions below
    flavour = flavour_of(conn)
    schema, user = naming.tenant_schema(tenant), naming.tenant_user(tenant)
    report = ProvisionReport(tenant, schema, user, flavour=f"{flavour.name} {flavour.version}")
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {q(schema)} CHARACTER SET utf8mb4")
        for name, select in tenant_views(naming, tenant):
            # MERGE keeps the tenant filter inside the caller's query (indexes apply);
            # DEFINER security lets the view read a base table its reader cannot.
            cur.execute(
                f"CREATE OR REPLACE ALGORITHM=MERGE SQL SECURITY DEFINER "
                f"VIEW {q(schema)}.{q(name)} AS {select}",
            )
            report.views.append(f"{schema}.{name}")
        account = ensure_user(
            cur,
            user,
            host,
            naming.password(user),
            flavour.user_limits(max_connections, statement_seconds),
            require_ssl,
        )
        for name, _ in tenant_views(naming, tenant):
            cur.execute(f"GRANT SELECT ON {q(schema)}.{q(name)} TO {account}")
        planner = ensure_planner(
            conn,
            naming,
            host=host,
            seconds=planner_statement_seconds,
            max_connections=max_connections,
            require_ssl=require_ssl,
        )
        for name, _ in tenant_views(naming, tenant):
            cur.execute(f"GRANT SELECT, SHOW VIEW ON {q(schema)}.{q(name)} TO {planner}")
    if policy_dir is not None:
        policy_dir.mkdir(parents=True, exist_ok=True)
        path = policy_dir / f"{tenant}.yaml"
        path.write_text(dump_policy(tenant_policy(naming, tenant, max_limit)))
        report.policy_path = path
    return report


def ensure_planner(
    conn: Any, naming: Naming, *, host: str, seconds: float, max_connections: int,
    require_ssl: bool = False,
) -> str:  # fmt: skip
    """The EXPLAIN-only account; its grants on tenant views are added per tenant."""
    flavour = flavour_of(conn)
    user = naming.planner_user
    with conn.cursor() as cur:
        # No REVOKE: it keeps the grants on every tenant's views made so far.
        account = ensure_user(cur, user, host, naming.password(user),
                              flavour.user_limits(max_connections, seconds), require_ssl,
                              revoke=False)  # fmt: skip
        for spec in TABLES:
            db = naming.ops_db if spec.db == "ops" else naming.pay_db
            cur.execute(f"GRANT SELECT ON {q(db)}.{q(spec.name)} TO {account}")
    return account


def provision_auditor(
    conn: Any, naming: Naming, *, host: str, audit_db: str, password: str | None = None,
    require_ssl: bool = False,
) -> str:  # fmt: skip
    """The audit table, its hash chain and the INSERT-only account (`password`, else one
    derived from the naming secret)."""
    flavour = flavour_of(conn)
    user = naming.auditor_user
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {q(audit_db)} CHARACTER SET utf8mb4")
        cur.execute(f"CREATE TABLE IF NOT EXISTS {q(audit_db)}.{q(AUDIT_TABLE)} {AUDIT_DDL}")
    ensure_chain_schema(conn, audit_db)  # event id key, hash chain columns, head, trigger
    with conn.cursor() as cur:
        account = ensure_user(
            cur,
            user,
            host,
            password or naming.password(user),
            flavour.user_limits(4, 10),
            require_ssl,
        )
        cur.execute(f"GRANT INSERT ON {q(audit_db)}.{q(AUDIT_TABLE)} TO {account}")
    return account
