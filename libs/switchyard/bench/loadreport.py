"""A sweep's capacity report: the three answers, the table behind them, and its JSON.

Every capacity report must answer ([S4] §8.3): how many concurrent requests one
replica carries safely, the p99 at that load, and what 1,000 requests cost at a
given GPU price. The operating point is the largest swept load at or below the
recommended admission limit (0.8 x knee); without a knee, the largest load that
met the SLO, flagged as a lower bound because the fleet never saturated.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchyard.bench.knee import MIN_GAIN, Knee, Point, find_knee
from switchyard.bench.loadstats import RunStats
from switchyard.bench.stats import Report


@dataclass
class SweepMeta:
    target: str  # "nats" or "edge <url>"
    workload: str
    arrival: str  # kind
    fleet: str  # what served it, in words (engine, workers, delay scale)
    replicas: int  # engines (GPUs) behind the target: the per-replica divisor
    gpu_price_per_hour: float
    duration_s: float
    warmup_s: float
    seed: int
    started_at: str
    notes: list[str] = field(default_factory=list)
    # The knee's throughput-gain threshold; short windows on a noisy box need more than 5 %.
    knee_min_gain: float = MIN_GAIN


@dataclass
class OperatingPoint:
    basis: str  # how it was chosen, in words
    load: float
    concurrency_per_replica: float
    p99_ms: float
    ttft_p99_ms: float
    goodput_rps: float
    throughput_rps: float
    cost_per_1k_requests: float | None  # at goodput; None when nothing was good


@dataclass
class SweepResult(Report):
    meta: SweepMeta
    runs: list[RunStats]  # ascending load
    knee: Knee | None
    goodput_peak_load: float | None
    operating: OperatingPoint | None


def cost_per_1k(price_per_hour: float, replicas: int, rps: float) -> float | None:
    """GPU cost of 1,000 requests served at `rps` by `replicas` GPUs at `price_per_hour` each."""
    if rps <= 0:
        return None
    return round(price_per_hour * replicas / 3600 / rps * 1000, 4)


def _operating(
    runs: list[RunStats], knee: Knee | None, peak: float | None, meta: SweepMeta
) -> OperatingPoint | None:
    if not runs:
        return None
    if knee is not None:
        # Never past the goodput peak ([S4] §1.2: limit where goodput tops out): a coarse
        # sweep can put 0.8 x knee above a load that was already overloaded.
        cap = min(knee.recommended_limit, peak if peak is not None else math.inf)
        below = [r for r in runs if r.load <= cap]
        if below:
            at = below[-1]
            basis = (
                f"the largest swept load at or below the limit {knee.recommended_limit:g} "
                f"(0.8 x knee {knee.load:g})"
            )
            if cap < knee.recommended_limit:
                basis += f" and the goodput peak {peak:g}"
        else:
            at = runs[0]
            basis = (
                f"the lightest swept load: none was at or below the limit "
                f"{knee.recommended_limit:g}; sweep lower loads"
            )
    else:
        met = [r for r in runs if r.slo_met]
        at = met[-1] if met else runs[0]
        basis = (
            "no knee within the sweep (the fleet did not saturate): the largest load that met "
            "the SLO - a lower bound on capacity" if met else
            "no knee and no load met the SLO: the lightest load, for reference"
        )  # fmt: skip
    if at.ok == 0:
        basis += "; NOTHING WAS ANSWERED at this load (see the errors), so there is no p99"
    per_replica = (at.mean_in_flight if at.open_loop else at.load) / max(meta.replicas, 1)
    return OperatingPoint(
        basis=basis, load=at.load, concurrency_per_replica=round(per_replica, 2),
        p99_ms=at.e2e_ms.p99 if at.ok else math.inf,
        ttft_p99_ms=at.ttft_ms.p99 if at.ok else math.inf, goodput_rps=at.goodput_rps,
        throughput_rps=at.throughput_rps,
        cost_per_1k_requests=cost_per_1k(meta.gpu_price_per_hour, meta.replicas, at.goodput_rps),
    )  # fmt: skip


def build_result(meta: SweepMeta, runs: list[RunStats]) -> SweepResult:
    runs = sorted(runs, key=lambda r: r.load)
    # A load with no answers at all has an unbounded p99, not a zero one.
    points = [Point(r.load, r.throughput_rps, r.e2e_ms.p99 if r.ok else float("inf")) for r in runs]
    knee = find_knee(points, min_gain=meta.knee_min_gain) if len(points) > 1 else None
    peak = max(runs, key=lambda r: r.goodput_rps).load if runs else None
    return SweepResult(meta, runs, knee, peak, _operating(runs, knee, peak, meta))


def _unit(result: SweepResult) -> str:
    return "req/s" if result.runs and result.runs[0].open_loop else "users"


def markdown(result: SweepResult, plots: dict[str, str] | None = None) -> str:
    m, unit, op, knee = result.meta, _unit(result), result.operating, result.knee
    slo = result.runs[0].slo if result.runs else None
    lines = [
        f"# Load sweep: {m.workload} over {m.target}",
        "",
        f"- fleet: {m.fleet}; {m.replicas} replica(s)",
        f"- arrival: {m.arrival}; {m.duration_s:g} s measured per load after {m.warmup_s:g} s "
        f"warm-up (excluded); seed {m.seed}; started {m.started_at}",
    ]
    if slo:
        lines.append(
            f"- SLO: TTFT <= {slo.ttft_ms:g} ms, TPOT <= {slo.tpot_ms:g} ms, success >= "
            f"{slo.success:.1%}; latency measured from each request's due time"
        )
    lines += ["", "## Answers", ""]
    if op is None:
        lines.append("No runs.")
    else:
        cost = (f"${op.cost_per_1k_requests:.4f}" if op.cost_per_1k_requests is not None
                else "n/a (no request met the SLO)")  # fmt: skip
        lines += [
            f"1. **Safe concurrency per replica: {op.concurrency_per_replica:g}** "
            f"(at {op.load:g} {unit}; {op.basis}).",
            f"2. **Its p99: {op.p99_ms:g} ms end to end** (TTFT p99 {op.ttft_p99_ms:g} ms).",
            f"3. **Cost per 1,000 requests: {cost}** at ${m.gpu_price_per_hour:g} per GPU-hour, "
            f"{m.replicas} GPU(s), goodput {op.goodput_rps:g} req/s "
            f"(nominal {op.throughput_rps:g} req/s).",
            "",
        ]
    if knee is not None:
        lines.append(
            f"Knee: **{knee.load:g} {unit}** (from {knee.previous_load:g}: throughput "
            f"{knee.throughput_gain:+.1%}, p99 {knee.p99_growth:+.0%}); recommended admission "
            f"limit **{knee.recommended_limit:g} {unit}** (0.8 x knee)."
        )
    else:
        lines.append("Knee: none within the sweep (throughput still grew, or p99 never jumped).")
    if result.goodput_peak_load is not None:
        lines.append(f"Goodput peaks at {result.goodput_peak_load:g} {unit}.")
    lines += [
        "",
        "## Runs",
        "",
        f"| load ({unit}) | req | ok | req/s | goodput/s | good % | in tok/s | out tok/s | "
        "TTFT p50/p99 ms | TPOT p50/p99 ms | ITL p99 ms | e2e p50/p90/p99 ms | errors | "
        "send lag p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.runs:
        errors = ", ".join(f"{k} {v}" for k, v in sorted(r.errors.items())) or "-"
        lines.append(
            f"| {r.load:g} | {r.requests} | {r.ok} | {r.throughput_rps:g} | {r.goodput_rps:g} | "
            f"{r.good_fraction:.1%} | {r.input_tokens_per_s:g} | {r.output_tokens_per_s:g} | "
            f"{r.ttft_ms.p50:g}/{r.ttft_ms.p99:g} | {r.tpot_ms.p50:g}/{r.tpot_ms.p99:g} | "
            f"{r.itl_ms.p99:g} | {r.e2e_ms.p50:g}/{r.e2e_ms.p90:g}/{r.e2e_ms.p99:g} | {errors} | "
            f"{r.send_lag_ms.p99:g} |"
        )
    lines += [
        "",
        "Errors: `429` over quota, `503` no capacity, `504` deadline or fleet timeout, `stale` "
        "an agent frame older than its budget, `client_timeout` no answer within the "
        "harness's timeout. Send lag = sent - due: above a few ms the harness could not keep "
        "its schedule and the load offered was lighter than nominal.",
    ]
    examples = {k: v for r in result.runs for k, v in r.error_examples.items()}
    if examples:
        lines += ["", "One example per error class:", ""]
        lines += [f"- `{k}`: {v}" for k, v in sorted(examples.items())]
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{name}]({path})" for name, path in plots.items()]
    if m.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in m.notes]
    return "\n".join(lines) + "\n"


def write(result: SweepResult, out: Path, plots: dict[str, str] | None = None) -> dict[str, Path]:
    """`report.md` and `sweep.json` in `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "report.md", out / "sweep.json"
    md.write_text(markdown(result, plots))
    data = result.as_dict()
    data["plots"] = plots or {}
    js.write_text(json.dumps(finite(data), indent=1, allow_nan=False))
    return {"report": md, "json": js}


def finite(x: Any) -> Any:
    """`x` with every non-finite float as None: JSON has no Infinity (p99 of a load
    nothing answered, the p99 growth into it)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite(v) for v in x]
    return x
