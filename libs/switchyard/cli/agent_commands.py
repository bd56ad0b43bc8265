"""`sy agent-sim`: the cloud-phone simulator, and its capacity search (`--search`)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from switchyard.bench.agentsim import CapacityReport

DEFAULT_LADDER = "50,100,200,400,600,800"


def agent_sim(
    phones: int = typer.Option(8, min=1, help="concurrent episodes"),
    steps: int = typer.Option(10, min=1, max=256, help="steps per episode"),
    engine: str = typer.Option("llamacpp", help="llamacpp or sim (the GPU simulator)"),
    workers: int | None = typer.Option(None, min=1, help="default: 8 for sim, 1 otherwise"),
    resolution: str = typer.Option("1280x720", "--resolution", "--frame-size", help="frame WxH"),
    stale_after: float | None = typer.Option(
        None, help="wall s; default 2 x delay scale (sim), 60 (llamacpp)"
    ),
    max_tokens: int = typer.Option(48, min=8, max=512),
    scatter: bool = typer.Option(False, help="new partition key per step (no affinity)"),
    nats_url: str | None = typer.Option(None, "--nats", help="a running fleet; start nothing"),
    delay_scale: float = typer.Option(
        1.0, min=0.0, help="sim: wall s per modelled s (SY_SIM_DELAY_SCALE of started workers)"
    ),
    frame_pool: int = typer.Option(
        0, min=0, max=64, help="frames drawn per phone before the run, then cycled; 0 = live"
    ),
    stagger: float | None = typer.Option(
        None, min=0.0, help="wall s over which phones start; default 0, or 0.5 x delay scale"
    ),
    search: bool = typer.Option(False, help="capacity search over --loads (sim engine)"),
    loads: str = typer.Option(DEFAULT_LADDER, help="--search: phone counts to climb"),
    target_ms: float = typer.Option(500.0, help="--search: modelled p99 target"),
    search_step: int = typer.Option(25, min=1, help="--search: bisect until this close"),
    min_loop_efficiency: float = typer.Option(0.8, min=0.0, max=1.0, help="--search"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """N phones, each a strict step -> action loop; latency, staleness and prefix reuse."""
    from switchyard.bench.agentsim import AgentSimConfig, run_agent_sim, run_capacity_search

    w, _, h = resolution.partition("x")
    sim = engine == "sim"
    cfg = AgentSimConfig(
        phones=phones, steps=steps, engine=engine,
        workers=workers or (8 if sim else 1), width=int(w), height=int(h),
        # llama.cpp on a CPU serves one step at a time: a 2 s budget would drop most.
        # A slowed sim clock (delay scale) stretches the wall budget with it.
        stale_after=stale_after or (2.0 * max(delay_scale, 1.0) if sim else 60.0),
        max_tokens=max_tokens, scatter=scatter, nats_url=nats_url,
        delay_scale=delay_scale if sim else 1.0, frame_pool=frame_pool,
        stagger_s=stagger if stagger is not None else (0.5 * delay_scale if search else 0.0),
    )  # fmt: skip
    if search:
        ladder = sorted({int(n) for n in loads.split(",") if n.strip()})
        report = run_capacity_search(cfg, ladder, target_ms, search_step, min_loop_efficiency)
        if as_json:
            print(json.dumps(_finite(report.as_dict())))
            return
        _print_search(report)
        return
    single = run_agent_sim(cfg)
    if as_json:
        print(json.dumps(_finite(single.as_dict())))
        return
    rest = {k: v for k, v in asdict(single).items() if k != "config"}
    Console().print_json(json.dumps(_finite(rest)))


def _finite(value: object) -> object:
    """JSON has no infinity: a p99 that some step never met (inf) prints as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _print_search(report: CapacityReport) -> None:
    c = report.config
    table = Table(
        title=f"agent capacity: {c.workers} {c.engine} workers, {c.width}x{c.height} frames, "
        f"max_tokens {c.max_tokens}, {c.steps} steps/phone, delay scale {c.delay_scale}"
    )
    cols = ("phones", "steps", "ok", "stale", "err", "wall p50", "wall p99", "model p50",
            "model p99", "p99 tail: queue", "prefill", "decode", "loop eff", "outside p50",
            "pass")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="right")
    for r in report.loads:
        m = r.modelled
        t = m.tail_parts_ms if m else {}
        queue = round(t.get("router", 0) + t.get("dispatch", 0) + t.get("engine_queue", 0), 1)
        table.add_row(
            str(r.phones), str(r.steps), str(r.ok), str(r.stale), str(sum(r.errors.values())),
            f"{r.wall_p50_ms}", f"{r.wall_p99_ms}",
            f"{m.p50_ms}" if m else "-", f"{m.p99_ms}" if m else "-",
            f"{queue}" if m else "-", f"{t.get('prefill', '-')}", f"{t.get('decode', '-')}",
            f"{m.loop_efficiency}" if m else "-", f"{m.outside_p50_ms}" if m else "-",
            "yes" if r.passed else "no",
        )  # fmt: skip
    con = Console()
    con.print(table)
    at = report.at_capacity
    if at is None or at.modelled is None or report.capacity is None:
        con.print(f"capacity: below {report.loads[0].phones} phones ({report.loads[0].reason})")
    else:
        ratio = round(at.modelled.p99_ms / report.target_p99_ms, 2)
        con.print(
            f"capacity: {report.capacity} phones ({report.capacity / c.workers:.0f} per worker) "
            f"with modelled p50 {at.modelled.p50_ms} ms, p99 {at.modelled.p99_ms} ms "
            f"({ratio} x the {report.target_p99_ms:.0f} ms target); wall p50 {at.wall_p50_ms} "
            f"ms, p99 {at.wall_p99_ms} ms on this machine"
        )
    con.print(f"limit: {report.limit}")
    if report.first_failure is not None:
        con.print(
            f"first failure: {report.first_failure.phones} phones: {report.first_failure.reason}"
        )
    for note in report.notes:
        con.print(f"note: {note}")
    con.print(f"search took {report.wall_s} s")


def register(app: typer.Typer) -> None:
    app.command("agent-sim")(agent_sim)
