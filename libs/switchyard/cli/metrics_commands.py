"""`sy metrics catalog`: the table of every exported metric (deploy/metrics.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from switchyard.cli import err
from switchyard.metrics_catalog import catalog, compare, render_table, write_table

metrics_app = typer.Typer(help="Prometheus metrics: the catalog of what the services export.")

DEFAULT_DOC = Path("deploy/metrics.md")


@metrics_app.command("catalog")
def catalog_command(
    path: Annotated[Path, typer.Option("--path", help="the catalog document")] = DEFAULT_DOC,
    write: Annotated[bool, typer.Option("--write", help="regenerate the table in --path")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="exit 1 when --path is out of date")
    ] = False,
) -> None:
    """Print the catalog table; `--write` updates the document, `--check` compares it."""
    entries = catalog()
    if write:
        write_table(path, entries)
        err.print(f"wrote {len(entries)} metrics to {path}")
    elif check:
        problems = compare(path.read_text(), entries)
        for problem in problems:
            err.print(f"[red]{problem}[/red]")
        if problems:
            raise typer.Exit(1)
        err.print(f"{path}: {len(entries)} metrics, in step with the code")
    else:
        typer.echo(render_table(entries))


def register(app: typer.Typer) -> None:
    app.add_typer(metrics_app, name="metrics")
