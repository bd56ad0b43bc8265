"""`sy bench ...`: benchmarks that compare paths side by side in one run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

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


@bench.command("sql-validate")
def sql_validate_cmd(
    corpora: Path | None = typer.Option(None, help="default: SY_SQL_CORPORA or ../shared/corpora"),
    rounds: int = typer.Option(1, min=1, help="passes over the corpora"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Validations/s and p99 latency of the SQL validator over the corpora."""
    from switchyard.bench.sqlvalidate import run_validate_bench
    from switchyard.sqlguard.corpora import default_dir

    directory = corpora or default_dir()
    if not (directory / "bird_minidev_mysql_gold.json").is_file():
        raise typer.BadParameter(f"no corpora in {directory}")
    result = run_validate_bench(directory, rounds)
    if as_json:
        print(json.dumps(result.as_dict()))
        return
    table = Table("statements", "validations/s", "p50 ms", "p99 ms", "max ms", "crashes")
    table.add_row(
        str(result.statements), f"{result.validations_per_s:.0f}", f"{result.p50_ms:.2f}",
        f"{result.p99_ms:.2f}", f"{result.max_ms:.2f}", str(result.crashes),
    )  # fmt: skip
    console.print(table)
    console.print(
        f"gold accepted {result.gold_accepted}/{result.gold_total}; LLM predictions accepted "
        f"{result.predictions_accepted}/{result.predictions_total}, the rest rejected cleanly"
    )


@bench.command("sql-exec")
def sql_exec_cmd(
    dsn: str | None = typer.Option(None, "--dsn", help="admin DSN (default: SY_MYSQL_DSN)"),
    nats_url: str | None = typer.Option(None, "--nats", help="default: an embedded server"),
    tenant: str = typer.Option("acme", help="demo tenant whose views are queried"),
    requests: int = typer.Option(100, min=5, help="requests per path per round"),
    rounds: int = typer.Option(2, min=1, help="rounds, alternating raw and aggregated"),
    pool: int = typer.Option(4, min=1, help="executor pool size = client concurrency"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Top-metric questions: raw tables vs pre-aggregated ones, through the executor."""
    from switchyard.bench.sqlexec import run_exec_bench

    result = run_exec_bench(
        dsn=dsn, nats_url=nats_url, tenant=tenant, requests=requests, rounds=rounds,
        pool_size=pool,
    )  # fmt: skip
    if as_json:
        print(json.dumps(result.as_dict()))
        return
    table = Table("path", "queries/s", "p50 ms", "p99 ms", "rows examined/query")
    for name, path in (("raw tables", result.raw), ("pre-aggregated", result.aggregated)):
        table.add_row(
            name, f"{path.queries_per_s:.1f}", f"{path.p50_ms:.1f}", f"{path.p99_ms:.1f}",
            f"{path.rows_examined_per_query:,.0f}",
        )  # fmt: skip
    console.print(table)
    console.print(
        f"capacity ratio {result.ratio:.1f}x (goal >= 10x), p99 ratio {result.p99_ratio:.1f}x; "
        f"answers match: {result.answers_match}; pool {result.pool_size}, "
        f"{sum(result.demo_rows.values()):,} demo rows"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(bench, name="bench")


@bench.command("edge")
def edge_cmd(
    requests: int = typer.Option(400, min=1, help="measured requests per path"),
    concurrency: int = typer.Option(8, min=1, help="clients in flight, both paths together"),
    max_tokens: int = typer.Option(16, min=1),
    nats_url: str | None = typer.Option(None, "--nats", help="default: an embedded server"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Latency the HTTP edge adds over publishing the same chat requests straight on NATS."""
    from switchyard.bench.edge import run_edge_bench
    from switchyard.logging import configure

    configure("warning", service="sy-bench", json=False)  # keep stdout for the result
    result = run_edge_bench(
        nats_url=nats_url, requests=requests, concurrency=concurrency, max_tokens=max_tokens
    )
    if as_json:
        print(json.dumps(result.as_dict()))
        return
    table = Table("path", "p50 ms", "p99 ms", "mean ms")
    table.add_row("NATS direct (llm.in)", f"{result.direct_p50_ms:.2f}",
                  f"{result.direct_p99_ms:.2f}", f"{result.direct_mean_ms:.2f}")  # fmt: skip
    table.add_row("HTTP edge", f"{result.edge_p50_ms:.2f}", f"{result.edge_p99_ms:.2f}",
                  f"{result.edge_mean_ms:.2f}")  # fmt: skip
    table.add_row("edge adds", f"{result.added_p50_ms:+.2f}", f"{result.added_p99_ms:+.2f}", "")
    console.print(table)
    console.print(
        f"{result.requests_per_path} requests per path, interleaved, {result.concurrency} in "
        f"flight, sim engine at zero delay, {result.wall_s:.1f} s; errors: {result.errors}"
    )
