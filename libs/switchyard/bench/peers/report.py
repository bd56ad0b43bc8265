"""Results as a rich table, a JSON document and a PNG bar chart (matplotlib, Agg backend)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from switchyard.bench.peers.overhead import DIRECT, OverheadColumn, OverheadResult
from switchyard.bench.peers.routing import PolicyRow, RoutingResult
from switchyard.bench.peers.stats import Latency


def overhead_table(result: OverheadResult, versions: dict[str, str]) -> Table:
    c = result.config
    table = Table(
        "path", "p50 ms", "p99 ms", "req/s", "adds p50 ms", "adds p99 ms", "errors",
        title=(f"Overhead: {c.requests} requests per path, {c.concurrency} in flight, "
               f"sim at zero delay, max_tokens {c.max_tokens}"),
        caption=_caption(versions),
    )  # fmt: skip
    for name, col in result.columns.items():
        base = name == DIRECT
        table.add_row(
            name, f"{col.latency.p50_ms:.2f}", f"{col.latency.p99_ms:.2f}", f"{col.rps:.0f}",
            "-" if base else f"{col.added_p50_ms:+.2f}",
            "-" if base else f"{col.added_p99_ms:+.2f}",
            str(col.errors),
        )  # fmt: skip
    return table


# A process that used less than this per request while a column ran is left out of its
# row (background: heartbeats, idle pulls).
CPU_SHOWN_MS = 0.02


def cpu_table(result: OverheadResult) -> Table:
    """CPU ms per request, a row per process, a column per path (each path measured while
    it ran alone; a process idle meanwhile shows its background cost)."""
    cols = {k: c.cpu_ms_per_request or {} for k, c in result.columns.items()}
    procs = sorted({p for per in cols.values() for p, ms in per.items() if ms >= CPU_SHOWN_MS})
    table = Table("process", *cols, title="CPU ms per request, per process")
    for proc in procs:
        cells = [f"{per[proc]:.2f}" if per.get(proc, 0.0) >= CPU_SHOWN_MS else "" for per in
                 cols.values()]  # fmt: skip
        table.add_row(proc, *cells)
    table.add_row("total", *(f"{sum(per.values()):.2f}" for per in cols.values()), style="bold")
    return table


ROUTING_ROWS: list[tuple[str, Callable[[PolicyRow], str]]] = [
    ("prefix hit rate", lambda r: f"{r.prefix_hit_rate:.1%}"),
    ("TTFT p50 / p99 ms (wall)", lambda r: f"{r.ttft.p50_ms:.0f} / {r.ttft.p99_ms:.0f}"),
    ("e2e p50 / p99 ms (wall)", lambda r: f"{r.e2e.p50_ms:.0f} / {r.e2e.p99_ms:.0f}"),
    ("request p50 / p99 ms (modelled)",
     lambda r: f"{r.modelled_e2e.p50_ms:.0f} / {r.modelled_e2e.p99_ms:.0f}"),
    ("imbalance, busy time", lambda r: f"{r.imbalance_busy:.2f}"),
    ("imbalance, requests", lambda r: f"{r.imbalance_requests:.2f}"),
    ("stickiness", lambda r: f"{r.stickiness:.2f}"),
    ("throughput req/s (wall)", lambda r: f"{r.throughput_rps:.0f}"),
    ("requests ok / failed", lambda r: f"{r.requests}/{r.failed}"),
]  # fmt: skip


def routing_rows(result: RoutingResult) -> list[tuple[str, Callable[[PolicyRow], str]]]:
    """The table's rows for this run's workload (chat adds the tenants' reach)."""
    rows = list(ROUTING_ROWS)
    if result.config.workload == "chat":
        n = result.config.backends
        rows.insert(-2, ("busiest tenant's backends",
                         lambda r: f"{r.busiest_tenant_backends} of {n}"))  # fmt: skip
        rows.insert(-2, ("backends per tenant",
                         lambda r: " ".join(map(str, r.tenant_backends.values()))))  # fmt: skip
    return rows


def routing_title(result: RoutingResult) -> str:
    c = result.config
    if c.workload == "agent":
        size = f"{c.sessions} sessions x {c.steps} steps"
    else:
        h = c.chat
        size = (f"{h.tenants} tenants, {h.conversations} conversations x {h.turns} turns "
                f"+ {h.one_shots} one-shots, {h.concurrency} lanes")  # fmt: skip
    return (f"Routing ({c.workload}): {size} on {c.backends} sim backends "
            f"(delay scale {c.delay_scale}, seed {c.seed})")  # fmt: skip


def routing_table(result: RoutingResult, versions: dict[str, str]) -> Table:
    table = Table(
        "", *result.rows,
        title=routing_title(result),
        caption=_caption(versions)
        + "; modelled = the sim's A100-calibrated time reported by the backends; imbalance = "
        "max/mean over backends",
    )  # fmt: skip
    for label, cell in routing_rows(result):
        table.add_row(label, *(cell(r) for r in result.rows.values()))
    return table


def routing_markdown(result: RoutingResult) -> str:
    """The routing table as markdown (for the README's performance notes)."""
    lines = [f"{routing_title(result)}", "", "| | " + " | ".join(result.rows) + " |",
             "| --- |" + " --- |" * len(result.rows)]  # fmt: skip
    for label, cell in routing_rows(result):
        lines.append(f"| {label} | " + " | ".join(cell(r) for r in result.rows.values()) + " |")
    return "\n".join(lines) + "\n"


def _caption(versions: dict[str, str]) -> str:
    return "peers: " + ", ".join(f"{k} {v}" for k, v in versions.items())


def document(
    overhead: OverheadResult | None, routing: RoutingResult | None, versions: dict[str, str]
) -> dict[str, object]:
    return {
        "versions": versions,
        "overhead": overhead.as_dict() if overhead else None,
        "routing": routing.as_dict() if routing else None,
        "note": "the sim engine is a simulator of a vLLM GPU engine, not a model",
    }


def write_json(path: Path, doc: dict[str, object]) -> None:
    path.write_text(json.dumps(doc, indent=2) + "\n")


def write_png(
    path: Path, overhead: OverheadResult | None, routing: RoutingResult | None,
    versions: dict[str, str],
) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt

    panels: list[tuple[str, list[str], list[float], list[float] | None]] = []

    def p50_p99(title: str, names: list[str], latencies: list[Latency]) -> None:
        panels.append((title, names, [x.p50_ms for x in latencies], [x.p99_ms for x in latencies]))

    if overhead is not None:
        names = list(overhead.columns)
        cols: list[OverheadColumn] = list(overhead.columns.values())
        p50_p99("overhead: latency ms (p50, p99)", names, [c.latency for c in cols])
        panels.append(("overhead: requests/s", names, [c.rps for c in cols], None))
    if routing is not None:
        names = list(routing.rows)
        rows = list(routing.rows.values())
        panels.append(
            ("routing: prefix hit rate %", names, [100 * r.prefix_hit_rate for r in rows], None)
        )
        p50_p99("routing: modelled request ms (p50, p99)", names, [r.modelled_e2e for r in rows])
        p50_p99("routing: TTFT ms wall (p50, p99)", names, [r.ttft for r in rows])
        panels.append(("routing: imbalance (busy, max/mean)", names,
                       [r.imbalance_busy for r in rows], None))  # fmt: skip
    if not panels:
        raise ValueError("nothing to plot")
    fig, _ = plt.subplots(len(panels), 1, figsize=(10, 3.2 * len(panels)))
    for ax, (title, names, first, second) in zip(fig.axes, panels, strict=True):
        xs = range(len(names))
        width = 0.4 if second is not None else 0.7
        ax.bar(
            [x - (width / 2 if second else 0) for x in xs],
            first,
            width,
            label="p50" if second else None,
        )
        if second is not None:
            ax.bar([x + width / 2 for x in xs], second, width, label="p99")
            ax.legend(loc="upper left")
        ax.set_xticks(list(xs), names, rotation=12, fontsize=8)
        ax.set_title(title, fontsize=10)
    fig.suptitle("sy bench peers (" + _caption(versions) + ")", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.98))  # leave the top for the suptitle
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_tables(
    console: Console, overhead: OverheadResult | None, routing: RoutingResult | None,
    versions: dict[str, str],
) -> None:  # fmt: skip
    if overhead is not None:
        console.print(overhead_table(overhead, versions))
        console.print(cpu_table(overhead))
        for k, c in overhead.columns.items():
            if c.hops_p50_ms:
                hops = ", ".join(f"{h} {ms:.1f}" for h, ms in c.hops_p50_ms.items())
                console.print(f"{k}: median ms per hop: {hops}")
        errs = {k: c.first_error for k, c in overhead.columns.items() if c.first_error}
        for k, e in errs.items():
            console.print(f"[red]{k}: first error: {e}[/red]")
    if routing is not None:
        console.print(routing_table(routing, versions))
        for k, r in routing.rows.items():
            if r.first_error:
                console.print(f"[red]{k}: first error: {r.first_error}[/red]")
