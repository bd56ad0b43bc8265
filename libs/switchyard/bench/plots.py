"""A sweep's PNG plots (matplotlib, Agg backend: no display needed).

- throughput.png: nominal throughput and goodput against offered load on the same
  axes - where they part, the fleet is doing work nobody can use - with the knee and
  the recommended limit marked;
- p99.png: end-to-end p50/p90/p99 and TTFT p99 against load (log scale: past the
  knee the tail grows by orders of magnitude);
- cdf.png: the end-to-end latency CDF of each load.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from switchyard.bench.loadreport import SweepResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def write_plots(result: SweepResult, out: Path) -> dict[str, str]:
    """Writes the PNGs into `out`; returns name -> file name (relative to `out`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    runs = result.runs
    unit = "offered load (req/s)" if runs and runs[0].open_loop else "concurrency (users)"
    loads = [r.load for r in runs]
    files: dict[str, str] = {}
    # Wrapped: the fleet's description (engine, workers, SY_SIM_* knobs) is long.
    title = "\n".join(textwrap.wrap(
        f"{result.meta.workload} via {result.meta.target} - {result.meta.fleet}", 110))  # fmt: skip

    def save(fig: Figure, ax: Axes, ylabel: str, name: str, file: str) -> None:
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        fig.tight_layout()
        fig.savefig(out / file, dpi=110)
        plt.close(fig)
        files[name] = file

    def marks(ax: Axes) -> None:
        knee = result.knee
        if knee is not None:
            ax.axvline(knee.load, color="red", ls="--", label=f"knee {knee.load:g}")
            limit = knee.recommended_limit
            ax.axvline(limit, color="green", ls=":", label=f"limit {limit:g} (0.8 x knee)")

    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot(loads, [r.throughput_rps for r in runs], "o-", label="throughput (req/s)")
    ax.plot(loads, [r.goodput_rps for r in runs], "s-", label="goodput (req/s within SLO)")
    if runs and runs[0].open_loop:
        ax.plot(loads, loads, color="grey", lw=0.8, label="offered")
    marks(ax)
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    save(fig, ax, "requests/s", "throughput and goodput vs load", "throughput.png")

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, values in (
        ("e2e p50", [r.e2e_ms.p50 for r in runs]),
        ("e2e p90", [r.e2e_ms.p90 for r in runs]),
        ("e2e p99", [r.e2e_ms.p99 for r in runs]),
        ("TTFT p99", [r.ttft_ms.p99 for r in runs]),
    ):
        ax.plot(loads, [max(v, 1e-3) for v in values], "o-", label=name)
    marks(ax)
    ax.set_yscale("log")
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    save(fig, ax, "ms (from each request's due time)", "p99 vs load", "p99.png")

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in runs:
        xs = r.e2e_sample_ms
        if xs:
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=f"{r.load:g}")
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency, ms (log)")
    ax.set_title(f"latency CDF per load - {title}", fontsize=9)
    ax.legend(title=unit, fontsize=7)
    save(fig, ax, "fraction of ok requests", "latency CDF", "cdf.png")
    return files
