"""`sy sql ...`: demo databases, tenant walls, and checking SQL against a policy."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table

from switchyard.cli import console, err
from switchyard.sqlguard import rules
from switchyard.sqlguard.policy import Policy, load_policy
from switchyard.sqlguard.validator import validate
from switchyard.sqlguard.verdict import Verdict

sql = typer.Typer(help="Text2SQL safety: demo databases, tenant walls, the SQL guard.")

Dsn = Annotated[
    str | None, typer.Option("--dsn", help="admin DSN (default: SY_MYSQL_DSN or root@localhost)")
]


def admin_settings(dsn: str | None, **overrides: Any) -> Any:
    from switchyard.sqldb.settings import AdminSettings

    values = {k: v for k, v in overrides.items() if v is not None}
    if dsn:
        values["mysql_dsn"] = dsn
    try:
        return AdminSettings(**values)
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from exc


@contextlib.contextmanager
def admin_session(
    settings: Any, failed: str, errors: tuple[type[Exception], ...] = (Exception,),
    exit_code: int = 1,
) -> Iterator[Any]:  # fmt: skip
    """The admin connection (`AdminSettings`: the DSN, TLS when SY_MYSQL_SSL_CA is set)
    for the block, closed after it. An unreachable server, or an error of `errors` in the
    block (after `failed`), is a one-line error and exit `exit_code`."""
    from switchyard.sqldb.admin import connect_admin

    try:
        conn = connect_admin(settings.admin_dsn(), settings.tls_context())
    except Exception as exc:
        err.print(f"[red]cannot connect to {settings.shown_dsn()}:[/red] {exc}")
        raise typer.Exit(exit_code) from exc
    try:
        yield conn
    except errors as exc:
        err.print(f"[red]{failed}:[/red] {exc}")
        raise typer.Exit(exit_code) from exc
    finally:
        conn.close()


def _verdict_for_line(line: str, policy: Policy, lines: bool, allow_any_table: bool) -> Verdict:
    text = line.rstrip("\r\n")
    if lines:
        statement = text
    else:
        if not text.strip():
            return Verdict(False, rule=rules.INPUT_EMPTY, detail="empty line")
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            return Verdict(False, rule=rules.INPUT_MALFORMED, detail=f"not JSON: {exc}")
        if not isinstance(obj, dict) or not isinstance(obj.get("sql"), str):
            return Verdict(
                False, rule=rules.INPUT_MALFORMED, detail='expected an object {"sql": "..."}'
            )
        statement = obj["sql"]
    return validate(statement, policy, allow_any_table=allow_any_table)


@sql.command("check")
def check(
    policy_file: Annotated[
        Path | None, typer.Option("--policy", help="policy YAML (dialect, max_limit, tables)")
    ] = None,
    lines: Annotated[
        bool, typer.Option("--lines", help='one statement per line instead of {"sql": ...}')
    ] = False,
    allow_any_table: Annotated[
        bool, typer.Option("--allow-any-table", help="check structure and safety only")
    ] = False,
) -> None:
    """Read statements from stdin; write one JSON verdict per input line to stdout."""
    if policy_file is None:
        if not allow_any_table:
            raise typer.BadParameter("--policy is required unless --allow-any-table is given")
        policy = Policy()
    else:
        try:
            policy = load_policy(policy_file)
        except (ValueError, ValidationError) as exc:
            raise typer.BadParameter(f"unusable policy {policy_file}: {exc}") from exc
    out = sys.stdout
    for line in sys.stdin:
        verdict = _verdict_for_line(line, policy, lines, allow_any_table)
        out.write(json.dumps(verdict.as_line(), ensure_ascii=False) + "\n")
        out.flush()


@sql.command("demo-db")
def demo_db(
    dsn: Dsn = None,
    prefix: Annotated[str | None, typer.Option(help="database name prefix")] = None,
    players: Annotated[int | None, typer.Option(help="players over all tenants")] = None,
    days: Annotated[int | None, typer.Option(help="days of activity")] = None,
    tenants: Annotated[str | None, typer.Option(help="comma-separated tenant ids")] = None,
    drop: Annotated[bool, typer.Option("--drop", help="remove the demo databases")] = False,
) -> None:
    """Create (or verify) the demo game_ops and game_pay databases; idempotent."""
    from switchyard.sqldb import demo
    from switchyard.sqldb.settings import naming

    settings = admin_settings(
        dsn,
        sql_demo_prefix=prefix,
        sql_demo_players=players,
        sql_demo_days=days,
        sql_demo_tenants=tenants.split(",") if tenants else None,
    )
    names = naming(settings)
    with admin_session(settings, "demo-db failed", (demo.DemoError, ValueError)) as conn:
        if drop:
            demo.drop(conn, names.ops_db, names.pay_db)
            console.print(f"dropped {names.ops_db} and {names.pay_db}")
            return
        report = demo.generate(conn, names.ops_db, names.pay_db, settings)
    table = Table("table", "rows")
    for name, count in report.rows.items():
        table.add_row(name, f"{count:,}")
    console.print(table)
    console.print(
        f"{report.ops_db} + {report.pay_db}: {report.action} in {report.seconds:.1f}s, "
        f"{sum(report.rows.values()):,} rows"
    )


@sql.command("provision")
def provision(
    tenant: Annotated[list[str], typer.Option("--tenant", help="tenant id (repeatable)")],
    dsn: Dsn = None,
    policy_dir: Annotated[
        Path | None, typer.Option(help="where tenant policies go (SY_SQL_POLICY_DIR)")
    ] = None,
    auditor: Annotated[bool, typer.Option(help="also the INSERT-only auditor account")] = True,
    require_ssl: Annotated[
        bool | None,
        typer.Option(
            "--require-ssl/--no-require-ssl",
            help="make the accounts REQUIRE SSL (default: SY_SQL_REQUIRE_SSL, else off)",
        ),
    ] = None,
) -> None:
    """Per-tenant views, a SELECT-only account and its policy; the auditor account."""
    from switchyard.sqldb.provision import provision_auditor, provision_tenant
    from switchyard.sqldb.settings import auditor_password, naming

    settings = admin_settings(dsn, sql_policy_dir=policy_dir, sql_require_ssl=require_ssl)
    names = naming(settings)
    with admin_session(settings, "provisioning failed") as conn:
        for t in tenant:
            r = provision_tenant(
                conn,
                names,
                t,
                host=settings.sql_account_host,
                max_connections=settings.sql_max_user_connections,
                statement_seconds=settings.sql_user_statement_seconds,
                planner_statement_seconds=settings.sql_planner_statement_seconds,
                policy_dir=settings.sql_policy_dir,
                max_limit=settings.sql_max_limit,
                require_ssl=settings.sql_require_ssl,
            )
            tls = ", REQUIRE SSL" if settings.sql_require_ssl else ""
            console.print(
                f"tenant {r.tenant}: schema {r.schema}, {len(r.views)} views, account {r.user} "
                f"({r.flavour}{tls}), policy {r.policy_path}"
            )
        if auditor:
            account = provision_auditor(
                conn, names, host=settings.sql_account_host, audit_db=settings.sql_audit_db,
                password=auditor_password(settings), require_ssl=settings.sql_require_ssl,
            )  # fmt: skip
            console.print(f"auditor: {account} may INSERT into {settings.sql_audit_db}.sql_audit")


def register(app: typer.Typer) -> None:
    from switchyard.cli import text2sql_commands
    from switchyard.cli.knowledge_commands import knowledge

    sql.add_typer(knowledge, name="knowledge")
    text2sql_commands.register(sql)
    app.add_typer(sql, name="sql")
