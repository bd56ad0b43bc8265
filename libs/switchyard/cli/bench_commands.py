"""`sy bench ...`: benchmarks that compare paths side by side in one run."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import typer
from rich.table import Table

from switchyard.bench.routeload import AGENT_ACT_S, ChatConfig
from switchyard.cli import console, err, peers_commands

bench = typer.Typer(help="Benchmarks, measured side by side in one run (medians).")


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Whatever the run prints goes to stderr, leaving stdout to the JSON: the logs of
    engines that log to stdout (structlog unconfigured, vLLM) and of the processes they
    start, which write to file descriptor 1 itself."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


@bench.command("engine")
def engine_cmd(
    rounds: int = typer.Option(5, min=1, help="measured rounds (plus one warm-up)"),
    requests: int | None = typer.Option(
        None, min=1, help="requests per round (default: 4, or 2 x --concurrency if more)"
    ),
    concurrency: int = typer.Option(1, min=1, help="requests in flight at once on each path"),
    max_tokens: int = typer.Option(64, min=1),
    engine: str = typer.Option("llamacpp", help="llamacpp, vllm or sim"),
    nats_url: str | None = typer.Option(None, "--nats", help="default: an embedded server"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Tokens/s of the raw engine vs. the same requests through a worker over NATS.

    The raw engine runs in this process with the worker's `SY_<ENGINE>_*` settings."""
    from switchyard.bench.engine import run_engine_bench

    with _stdout_to_stderr() if as_json else contextlib.nullcontext():
        result = run_engine_bench(
            nats_url=nats_url, rounds=rounds, requests=requests or max(4, 2 * concurrency),
            max_tokens=max_tokens, engine=engine, concurrency=concurrency,
        )  # fmt: skip
    if as_json:
        print(json.dumps(result.as_dict()))
        return
    table = Table("path", "tokens/s (median)", "per round")
    table.add_row("raw engine", f"{result.raw_tokens_per_s:.1f}", str(result.raw_rounds))
    table.add_row("worker + NATS", f"{result.fleet_tokens_per_s:.1f}", str(result.fleet_rounds))
    console.print(table)
    hops = ", ".join(f"{k} {v:.1f}" for k, v in result.fleet_hops_ms.items())
    console.print(
        f"{result.engine}, concurrency {result.concurrency}: ratio fleet/raw = "
        f"{result.ratio:.3f}; overhead {result.fleet_overhead_ms_per_request:.1f} ms per "
        f"request; served hops (ms) {hops}; a raw request {result.raw_request_ms:.1f} ms "
        "(medians)"
    )


CHAT = ChatConfig()  # the chat workload's defaults, shown by --help


@bench.command("route")
def route_cmd(
    workload: str = typer.Option("agent", help="agent (sessions x steps) or chat (tenants)"),
    workers: int = typer.Option(8, min=1, help="sim workers per policy"),
    sessions: int = typer.Option(200, min=1, help="agent: concurrent episodes"),
    steps: int = typer.Option(20, min=1, help="agent: steps per episode"),
    act_s: float = typer.Option(
        AGENT_ACT_S, "--act-s", min=0.0, help="agent: modelled s a phone acts between steps"
    ),
    tenants: int = typer.Option(
        CHAT.tenants, min=1, help="chat: tenants, each its own system prompt"
    ),
    conversations: int = typer.Option(
        CHAT.conversations, min=0, help="chat: multi-turn conversations"
    ),
    turns: int = typer.Option(CHAT.turns, min=1, help="chat: turns per conversation"),
    one_shots: int = typer.Option(CHAT.one_shots, min=0, help="chat: single-turn requests"),
    lanes: int = typer.Option(
        CHAT.concurrency, min=1, help="chat: client lanes, each one job at a time"
    ),
    skew: float = typer.Option(CHAT.skew, min=0.0, help="chat: Zipf exponent of tenant traffic"),
    delay_scale: float = typer.Option(
        1.0, min=0.001, help="wall s per modelled s (run speed only; results are modelled)"
    ),
    seed: int = typer.Option(0, min=0),
    policy: list[str] | None = typer.Option(None, "--policy", help="only these (repeatable)"),
    nats_url: str | None = typer.Option(
        None, "--nats", help="run on this NATS (default: an embedded server per policy)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """The real router's policies side by side on sim workers: cache hits, balance, TTFT."""
    from switchyard.bench.route import PolicyResult, RouteConfig, run_route_bench
    from switchyard.bench.routeload import WORKLOADS
    from switchyard.logging import configure
    from switchyard.scheduling.affinity import POLICIES, Policy

    if workload not in WORKLOADS:
        raise typer.BadParameter(f"--workload must be one of {', '.join(WORKLOADS)}")
    chosen = tuple(policy) if policy else POLICIES
    bad = [p for p in chosen if p not in POLICIES]
    if bad:
        raise typer.BadParameter(f"unknown policy {bad}; choose from {list(POLICIES)}")
    if workload == "chat" and conversations + one_shots == 0:
        raise typer.BadParameter("the chat workload needs conversations or one-shot requests")
    chat = ChatConfig(tenants, conversations, turns, one_shots, lanes, skew, seed)
    cfg = RouteConfig(
        workload=workload, workers=workers, delay_scale=delay_scale,
        seed=seed, sessions=sessions, steps=steps, act_s=act_s, chat=chat,
        policies=cast("tuple[Policy, ...]", chosen), nats_url=nats_url,
    )  # fmt: skip
    # The services log as they start and stop; keep stdout for the table or the JSON.
    configure("warning", service="sy-bench", json=False)
    result = run_route_bench(cfg)
    if as_json:
        print(json.dumps(result.as_dict()))
        return
    # Policies as columns: a dozen metrics side by side would not fit a terminal.
    rows: list[tuple[str, Callable[[PolicyResult], str]]] = [
        ("prefix hit rate", lambda r: f"{r.prefix_hit_rate:.1%}"),
        ("  after the first request", lambda r: f"{r.prefix_hit_rate_after_first:.1%}"),
        ("TTFT p50 / p99 (ms)", lambda r: f"{r.ttft_p50_ms:.0f} / {r.ttft_p99_ms:.0f}"),
        (f"{'step' if workload == 'agent' else 'request'} p50 / p99 (ms)",
         lambda r: f"{r.request_p50_ms:.0f} / {r.request_p99_ms:.0f}"),
        ("load imbalance (busy max/mean)", lambda r: f"{r.load_imbalance:.2f}"),
        (f"{'session' if workload == 'agent' else 'conversation'} stickiness",
         lambda r: f"{r.stickiness:.2f}"),
    ]  # fmt: skip
    if workload == "chat":
        rows += [
            ("busiest tenant's workers", lambda r: f"{r.busiest_tenant_workers} of {workers} "
             f"({r.busiest_tenant}, {r.busiest_tenant_share:.0%})"),
            ("workers per tenant", lambda r: " ".join(map(str, r.tenant_workers.values()))),
        ]  # fmt: skip
    rows += [
        ("requests ok / failed", lambda r: f"{r.requests}/{r.failed}"),
        ("wall s (this machine)", lambda r: f"{r.wall_s:.0f}"),
    ]
    size = f"{sessions} sessions x {steps} steps" if workload == "agent" else (
        f"{tenants} tenants: {conversations} conversations x {turns} turns + {one_shots} "
        f"one-shots, {lanes} lanes")  # fmt: skip
    table = Table(
        "", *result.results,
        title=f"sy bench route --workload {workload}: {size} on {workers} sim workers "
        f"(seed {seed})",
    )  # fmt: skip
    for label, cell in rows:
        table.add_row(label, *(cell(r) for r in result.results.values()))
    console.print(table)
    console.print(
        "Latencies are the sim's modelled (A100-calibrated) time, not wall clock; TTFT = "
        "queue + prefill + decode/output tokens; load imbalance = max/mean per-worker busy "
        "time; stickiness = share of a thread's requests on its most-used worker."
    )
    for name, r in result.results.items():
        if r.first_error:
            console.print(f"[red]{name}: {r.failed} failed, first: {r.first_error}[/red]")


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


@bench.command("sql-grammar")
def sql_grammar_cmd(
    rounds: int = typer.Option(3, min=1, help="builds, mask passes and generations each"),
    engine: bool = typer.Option(True, "--engine/--no-engine", help="also decode (llama.cpp)"),
    max_tokens: int = typer.Option(120, min=8, help="of each generated statement"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Text2SQL grammar: bytes and build time by views; mask cost and tokens/s by case."""
    from switchyard.bench.sqlgrammar import run_grammar_bench

    with _stdout_to_stderr() if as_json else contextlib.nullcontext():
        result = run_grammar_bench(rounds, engine=engine, max_tokens=max_tokens)
    if as_json:
        print(json.dumps(result.as_dict()))
        return
    sizes = Table("views", "bytes (largest)", "build ms", "its views")
    for s in result.sizes:
        sizes.add_row(str(s.views), str(s.grammar_bytes), f"{s.build_ms:.2f}", " ".join(s.worst))
    console.print(sizes)
    cases = Table("case", "bytes", "mask ms/token", "max", "floor", "tokens/s", "no grammar")
    for d in result.decoding:
        speed = "-" if d.tokens_per_s is None else f"{d.tokens_per_s:.1f}"
        free = (
            "-" if d.unconstrained_tokens_per_s is None else f"{d.unconstrained_tokens_per_s:.1f}"
        )
        cases.add_row(d.case, str(d.grammar_bytes), f"{d.mask_ms:.1f}", f"{d.mask_max_ms:.1f}",
                      f"{d.floor_ms:.1f}", speed, free)  # fmt: skip
    console.print(cases)
    for d in result.decoding:
        if d.generated is not None:
            console.print(f"{d.case}: {d.generated}")


@bench.command("load")
def load_cmd(
    target: str = typer.Option("nats", help="nats (publish on *.in.<tenant>) or edge (HTTP)"),
    workload: str = typer.Option("chat", help="chat, agent, sql or mixed"),
    arrival: str = typer.Option("poisson", help="poisson, constant, bursty or closed"),
    rate: float | None = typer.Option(None, min=0.001, help="req/s of a single open-loop run"),
    concurrency: int | None = typer.Option(None, min=1, help="users of a single closed run"),
    sweep: str | None = typer.Option(None, help="loads to sweep, e.g. 2,4,8,16 (req/s or users)"),
    duration: float = typer.Option(20.0, min=1, help="measured seconds per load"),
    warmup: float = typer.Option(3.0, min=0, help="seconds per load before measuring"),
    seed: int = typer.Option(0, min=0),
    slo_ttft_ms: float = typer.Option(1000.0, min=1),
    slo_tpot_ms: float = typer.Option(100.0, min=0.1),
    slo_success: float = typer.Option(0.99, min=0.001, max=1.0, help="good fraction to meet"),
    gpu_price_per_hour: float = typer.Option(2.0, min=0, help="USD per GPU-hour, for the cost"),
    knee_min_gain: float = typer.Option(
        0.05, min=0, help="knee: a step that buys less throughput than this (and +50 % p99)"
    ),
    replicas: int | None = typer.Option(
        None, min=1, help="engines behind the target (default: --fleet's workers, else 1)"
    ),
    out: Path | None = typer.Option(None, help="write report.md, sweep.json and PNGs here"),
    fleet: str | None = typer.Option(
        None, help="start a local fleet first: sim:N or llamacpp:N worker processes per pool"
    ),
    sim_delay_scale: float | None = typer.Option(
        None, min=0, help="--fleet sim: SY_SIM_DELAY_SCALE"
    ),
    sim_max_seqs: int | None = typer.Option(None, min=1, help="--fleet sim: SY_SIM_MAX_NUM_SEQS"),
    worker_env: list[str] = typer.Option(
        [], help="--fleet: KEY=VALUE for the workers, repeatable (e.g. SY_LLAMACPP_N_THREADS=1)"
    ),
    nats_url: str | None = typer.Option(None, "--nats", help="default: SY_NATS_URL"),
    edge_url: str = typer.Option("http://127.0.0.1:8080", help="--target edge without --fleet"),
    api_key: str = typer.Option("sk-local-dev", help="--target edge without --fleet"),
    tenant: str | None = typer.Option(
        None, help="tenant for NATS requests (default bench; sql: acme)"
    ),
    chat_input_tokens: int = typer.Option(128, min=1, help="median prompt words (chat)"),
    chat_output_tokens: int = typer.Option(32, min=1, help="median max_tokens (chat)"),
    agent_sessions: int = typer.Option(16, min=1, help="live episodes (agent)"),
    burst: int = typer.Option(8, min=1, help="requests per burst (bursty)"),
    timeout: float = typer.Option(60.0, min=0.1, help="seconds before a request counts as lost"),
    as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object"),
) -> None:
    """Open- or closed-loop load against the fleet: latency from each request's due time,
    goodput under SLOs, and over --sweep the knee, a recommended limit, report and plots."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from switchyard.bench.arrival import OPEN_KINDS
    from switchyard.bench.loadfleet import EDGE_KEY, TENANT, LocalFleet, local_fleet, parse_fleet
    from switchyard.bench.loadgen import Hooks, Record
    from switchyard.bench.loadreport import finite, markdown
    from switchyard.bench.loadstats import Slo
    from switchyard.bench.loadsweep import SweepConfig, run_sweep
    from switchyard.bench.workloads import WORKLOADS, AgentShape, ChatShape
    from switchyard.config import Settings
    from switchyard.logging import configure

    configure("warning", service="sy-bench", json=False)  # keep stdout for the result
    if target not in ("nats", "edge"):
        raise typer.BadParameter(f"--target must be nats or edge, got {target!r}")
    if workload not in WORKLOADS:
        raise typer.BadParameter(f"--workload must be one of {', '.join(WORKLOADS)}")
    if arrival not in (*OPEN_KINDS, "closed"):
        raise typer.BadParameter("--arrival must be poisson, constant, bursty or closed")
    if sweep:
        try:
            loads = [float(x) for x in sweep.split(",") if x.strip()]
        except ValueError:
            raise typer.BadParameter(
                f"--sweep must be numbers separated by commas: {sweep!r}"
            ) from None
    elif arrival == "closed":
        loads = [float(concurrency or 1)]
    else:
        if rate is None:
            raise typer.BadParameter("an open-loop run needs --rate or --sweep")
        loads = [rate]
    tenants = {"chat": tenant, "agent": tenant, "sql": tenant} if tenant else {}
    weights: dict[str, float] | None = None
    local: LocalFleet | None = None
    notes: list[str] = []
    if fleet:
        engine, n, pools = parse_fleet(fleet, workload)
        env: dict[str, str] = {}
        if engine == "sim" and sim_delay_scale is not None:
            env["SY_SIM_DELAY_SCALE"] = str(sim_delay_scale)
        if engine == "sim" and sim_max_seqs is not None:
            env["SY_SIM_MAX_NUM_SEQS"] = str(sim_max_seqs)
        for item in worker_env:
            key, sep, value = item.partition("=")
            if not sep or not key.startswith("SY_"):
                raise typer.BadParameter(f"--worker-env must be SY_KEY=VALUE, got {item!r}")
            env[key] = value
        local = LocalFleet(engine, n, pools, edge=target == "edge", env=env)
        tenants = {"chat": TENANT, "agent": TENANT}
        if workload == "mixed":  # the local fleet has no Text2SQL services
            weights = {"agent": 0.6, "chat": 0.4}
            notes.append("mixed without sql (the local fleet has no Text2SQL services): "
                         "agent 0.6, chat 0.4")  # fmt: skip
        notes.append(f"fleet started by this run: {local.describe()}, one router, one "
                     "preprocessor" + (", the edge" if local.edge else ""))  # fmt: skip
    base = SweepConfig(
        loads=loads, target=target, workload=workload, arrival=arrival,  # type: ignore[arg-type]
        burst=burst, duration_s=duration, warmup_s=warmup, seed=seed, request_timeout_s=timeout,
        slo=Slo(slo_ttft_ms, slo_tpot_ms, slo_success),
        replicas=replicas or (local.workers if local else 1),
        gpu_price_per_hour=gpu_price_per_hour, knee_min_gain=knee_min_gain,
        fleet=local.describe() if local else "an externally started fleet",
        tenants=tenants,  # type: ignore[arg-type]
        weights=weights,  # type: ignore[arg-type]
        chat=ChatShape(input_median=chat_input_tokens, output_median=chat_output_tokens),
        agent=AgentShape(sessions=agent_sessions), notes=notes,
    )  # fmt: skip

    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
        console=err, transient=False,
    )  # fmt: skip

    def hooks_for(load: float, expected: int | None) -> Hooks:
        task = progress.add_task(f"load {load:g}", total=expected, status="")
        counts = {"sent": 0, "done": 0, "errors": 0}

        def sent(_: Record) -> None:
            counts["sent"] += 1

        def done(rec: Record) -> None:
            counts["done"] += 1
            counts["errors"] += not rec.ok
            progress.update(task, advance=1, status=f"in flight {counts['sent'] - counts['done']}"
                            f", errors {counts['errors']}")  # fmt: skip

        return Hooks(on_sent=sent, on_done=done)

    from dataclasses import replace

    with contextlib.ExitStack() as stack:
        cfg = base
        if local is not None:
            nats, edge = stack.enter_context(local_fleet(local))
            cfg = replace(base, nats_url=nats, edge_url=edge or edge_url, api_key=EDGE_KEY)
        else:
            cfg = replace(base, nats_url=nats_url or Settings().nats_url, edge_url=edge_url,
                          api_key=api_key)  # fmt: skip
        with progress:
            result = run_sweep(cfg, out, hooks_for)
    if as_json:
        print(json.dumps(finite(result.as_dict())))
        return
    print(markdown(result))
    if out is not None:
        console.print(f"written: {out / 'report.md'}, {out / 'sweep.json'}, PNGs in {out}")


def register(app: typer.Typer) -> None:
    app.add_typer(bench, name="bench")


peers_commands.register(bench)


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
    table.add_row("NATS direct (req.llm + llm.edge)", f"{result.direct_p50_ms:.2f}",
                  f"{result.direct_p99_ms:.2f}", f"{result.direct_mean_ms:.2f}")  # fmt: skip
    table.add_row("HTTP edge", f"{result.edge_p50_ms:.2f}", f"{result.edge_p99_ms:.2f}",
                  f"{result.edge_mean_ms:.2f}")  # fmt: skip
    table.add_row("edge adds", f"{result.added_p50_ms:+.2f}", f"{result.added_p99_ms:+.2f}", "")
    console.print(table)
    console.print(
        f"{result.requests_per_path} requests per path, interleaved, {result.concurrency} in "
        f"flight, sim engine at zero delay, {result.wall_s:.1f} s; errors: {result.errors}"
    )
