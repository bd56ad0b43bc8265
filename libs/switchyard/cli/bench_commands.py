"""`sy bench ...`: benchmarks that compare paths side by side in one run."""

from __future__ import annotations

import json
from collections.abc import Callable

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


@bench.command("route")
def route_cmd(
    sessions: int = typer.Option(200, min=1, help="concurrent agent episodes"),
    steps: int = typer.Option(20, min=1, help="steps per episode"),
    workers: int = typer.Option(8, min=1, help="sim engines per policy"),
    delay_scale: float = typer.Option(
        0.1, min=0.001, help="wall s per modelled s (run speed only; results are modelled)"
    ),
    seed: int = typer.Option(0, min=0),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Placement policies on the same simulated agent workload: cache hits, TTFT, balance."""
    from switchyard.bench.route import PolicyResult, RouteConfig, run_route_bench
    from switchyard.logging import configure

    # Engines log on start and close; keep stdout for the table or the JSON.
    configure("warning", service="sy-bench", json=False)
    result = run_route_bench(RouteConfig(sessions, steps, workers, delay_scale, seed))
    if as_json:
        print(json.dumps(result.as_dict()))
        return
    # Policies as columns: ten metrics side by side would not fit a terminal.
    rows: list[tuple[str, Callable[[PolicyResult], str]]] = [
        ("prefix hit rate", lambda r: f"{r.prefix_hit_rate:.1%}"),
        ("  after step 1", lambda r: f"{r.prefix_hit_rate_after_first:.1%}"),
        ("TTFT p50 (ms)", lambda r: f"{r.ttft_p50_ms:.0f}"),
        ("TTFT p99 (ms)", lambda r: f"{r.ttft_p99_ms:.0f}"),
        ("step p50 (ms)", lambda r: f"{r.step_p50_ms:.0f}"),
        ("step p99 (ms)", lambda r: f"{r.step_p99_ms:.0f}"),
        ("load imbalance", lambda r: f"{r.load_imbalance:.2f}"),
        ("throughput (steps/s)", lambda r: f"{r.throughput_steps_per_s:.0f}"),
        ("session stickiness", lambda r: f"{r.stickiness:.2f}"),
        ("steps done", lambda r: f"{r.steps}/{r.steps + r.failed}"),
    ]
    table = Table(
        "", *result.results,
        title=f"{sessions} sessions x {steps} steps on {workers} sim workers (seed {seed})",
    )  # fmt: skip
    for label, cell in rows:
        table.add_row(label, *(cell(r) for r in result.results.values()))
    console.print(table)
    console.print(
        "Latencies and steps/s are the sim's modelled (A100-calibrated) time, not wall clock; "
        "load imbalance = max/mean per-worker busy time; stickiness = share of an episode's "
        "steps on its most-used worker."
    )


def register(app: typer.Typer) -> None:
    app.add_typer(bench, name="bench")
