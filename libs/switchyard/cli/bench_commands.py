"""`sy bench ...`: benchmarks that compare paths side by side in one run."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

console = Console()
bench = typer.Typer(help="Benchmarks, measured side by side in one run (medians).")


@bench.command("engine")
def engine_cmd(
    rounds: int = typer.Option(5, min=1, help="measured rounds (plus one warm-up)"),
    requests: int = typer.Option(4, min=1, help="requests per round, sequential"),
    max_tokens: int = typer.Option(64, min=1),
    engine: str = typer.Option("llamacpp", help="llamacpp or sim"),
    nats_url: str | None = typer.Option(None, "--nats", help="default: an embedded server"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Tokens/s of the raw engine vs. the same requests through a worker over NATS."""
    from switchyard.bench.engine import run_engine_bench

    result = run_engine_bench(
        nats_url=nats_url, rounds=rounds, requests=requests, max_tokens=max_tokens, engine=engine
    )
    if as_json:
        print(json.dumps(result.as_dict()))
        return
    table = Table("path", "tokens/s (median)", "per round")
    table.add_row("raw engine", f"{result.raw_tokens_per_s:.1f}", str(result.raw_rounds))
    table.add_row("worker + NATS", f"{result.fleet_tokens_per_s:.1f}", str(result.fleet_rounds))
    console.print(table)
    console.print(
        f"ratio fleet/raw = {result.ratio:.3f}; "
        f"overhead {result.fleet_overhead_ms_per_request:.1f} ms per request (median)"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(bench, name="bench")
