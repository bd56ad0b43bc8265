"""`sy metrics catalog`: the table of every exported metric (deploy/metrics.md);
`sy metrics rules`: the SLO alerts and goodput rules of deploy/prometheus/rules.yml, made
from the per-pool SLOs of deploy/prometheus/slos.yml."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from switchyard.cli import err
from switchyard.metrics_catalog import catalog, compare, render_table, write_table
from switchyard.slo import SloError, load_slos, render_rules, rules_in_step, write_rules

metrics_app = typer.Typer(help="Prometheus metrics: the catalog of what the services export.")

DEFAULT_DOC = Path("deploy/metrics.md")
DEFAULT_SLOS = Path("deploy/prometheus/slos.yml")
DEFAULT_RULES = Path("deploy/prometheus/rules.yml")


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


@metrics_app.command("rules")
def rules_command(
    slos: Annotated[Path, typer.Option("--slos", help="the per-pool SLOs")] = DEFAULT_SLOS,
    path: Annotated[Path, typer.Option("--path", help="the rules file")] = DEFAULT_RULES,
    write: Annotated[bool, typer.Option("--write", help="regenerate them in --path")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="exit 1 when --path is out of date")
    ] = False,
) -> None:
    """Print the rules the SLOs make; `--write` updates --path, `--check` compares it."""
    try:
        objectives = load_slos(slos)
        if write:
            write_rules(path, objectives)
            err.print(f"wrote the rules of {len(objectives.pools)} pools' SLOs to {path}")
        elif check:
            if not rules_in_step(path, objectives):
                err.print(f"[red]{path} is out of date with {slos}: "
                          "run `sy metrics rules --write`[/red]")  # fmt: skip
                raise typer.Exit(1)
            err.print(f"{path}: the SLO rules are in step with {slos}")
        else:
            typer.echo(render_rules(objectives), nl=False)
    except SloError as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    app.add_typer(metrics_app, name="metrics")
