"""`sy audit verify|query`: check the audit table's hash chain, read a tenant's events.

Both read with the admin DSN (`SY_MYSQL_DSN`, default root@127.0.0.1:3306): the
auditor's own account can only INSERT.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Annotated, Any

import typer
from rich.table import Table

from switchyard.cli import console, err
from switchyard.cli.sql_commands import Dsn, admin_session, admin_settings

audit = typer.Typer(help="The audit trail: verify its hash chain, query events.")

Db = Annotated[str | None, typer.Option("--db", help="audit database (SY_SQL_AUDIT_DB)")]

_SINCE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: dt.datetime | None = None) -> dt.datetime:
    """`90s`, `15m`, `1h`, `2d`, `1w`, or an ISO time (UTC) -> a naive UTC datetime."""
    now = now or dt.datetime.now(dt.UTC)
    m = _SINCE.match(text.strip())
    if m:
        at = now - dt.timedelta(seconds=float(m.group(1)) * _UNIT[m.group(2)])
    else:
        try:
            at = dt.datetime.fromisoformat(text)
        except ValueError as exc:
            raise typer.BadParameter(f"--since {text!r}: use 30m, 1h, 2d or an ISO time") from exc
        if at.tzinfo is None:
            at = at.replace(tzinfo=dt.UTC)
    return at.astimezone(dt.UTC).replace(tzinfo=None)


@audit.command("verify")
def verify(
    tenant: Annotated[str | None, typer.Option(help="only this tenant's chain")] = None,
    dsn: Dsn = None,
    db: Db = None,
) -> None:
    """Recompute every tenant's hash chain; exit 1 at the first broken link."""
    from switchyard.sqldb import auditchain

    settings = admin_settings(dsn, sql_audit_db=db or None)
    audit_db = settings.sql_audit_db
    with admin_session(settings, f"cannot read {audit_db}", exit_code=2) as conn:
        report = auditchain.verify(conn, audit_db, tenant)
    if report.broken is not None:
        b = report.broken
        where = f"tenant {b.tenant}" + (f", seq {b.seq}" if b.seq is not None else "")
        where += f" (row id {b.row_id})" if b.row_id else ""
        console.print(f"[red]BROKEN[/red] {where}: {b.reason}")
        console.print(f"{report.rows} row(s) verified before the break")
        raise typer.Exit(1)
    console.print(f"[green]OK[/green] {report.rows} row(s) in {report.tenants} tenant chain(s)")


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, dt.datetime):
            out[k] = v.isoformat()
        elif k == "detail" and isinstance(v, str):
            out[k] = json.loads(v)
        elif k == "killed":
            out[k] = bool(v)
        else:
            out[k] = v
    return out


@audit.command("query")
def query(
    tenant: Annotated[str, typer.Option(help="tenant id")],
    since: Annotated[str, typer.Option(help="how far back: 30m, 1h, 2d, or an ISO time")] = "1h",
    kind: Annotated[str | None, typer.Option(help="event kind (subject token), e.g. sql")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    limit: Annotated[int, typer.Option(min=1, max=100_000)] = 1000,
    dsn: Dsn = None,
    db: Db = None,
) -> None:
    """A tenant's audit events since a time, as a table or JSON lines."""
    from switchyard.sqldb import auditchain
    from switchyard.sqldb.naming import check_tenant

    try:
        check_tenant(tenant)  # a typo gets an error, not an empty answer
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tenant") from exc
    start = parse_since(since)
    settings = admin_settings(dsn, sql_audit_db=db or None)
    audit_db = settings.sql_audit_db
    with admin_session(settings, f"cannot read {audit_db}", exit_code=2) as conn:
        # One more than asked, to say so when the output is cut rather than cut it silently.
        rows = auditchain.query(
            conn, audit_db, tenant=tenant, since=start, kind=kind, limit=limit + 1
        )
    if len(rows) > limit:
        rows = rows[:limit]
        err.print(f"[yellow]more than {limit} events: showing the first {limit}[/yellow] "
                  "(narrow --since or raise --limit)")  # fmt: skip
    if as_json:
        for row in rows:
            print(json.dumps(_jsonable(row), ensure_ascii=False, default=str))
        return
    table = Table(title=f"audit of {tenant} since {start.isoformat(timespec='seconds')}Z")
    for col in ("at", "kind", "event", "actor", "verdict", "rule", "rows", "ms", "request", "sql"):
        table.add_column(col, overflow="fold")
    for r in rows:
        sql_text = (r["sql_text"] or r["question"] or "")[:120]
        ms = "" if r["duration_ms"] is None else f"{r['duration_ms']:.1f}"
        table.add_row(
            r["at"].isoformat(sep=" ", timespec="milliseconds"), r["kind"] or "", r["event"],
            r["actor"], r["verdict"] or "", r["rule"] or "",
            "" if r["rows_returned"] is None else str(r["rows_returned"]), ms, r["request_id"],
            sql_text + (" [killed]" if r["killed"] else ""),
        )  # fmt: skip
    console.print(table)
    console.print(f"{len(rows)} event(s)")


def register(app: typer.Typer) -> None:
    app.add_typer(audit, name="audit")
