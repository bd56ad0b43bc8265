"""`sy agent-sim`: the cloud-phone simulator, and its capacity search (`--search`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

# The option defaults are the fleet's (the best measured: README, "Agent steps").
from switchyard.agentprompt import DEFAULT_LAYOUT, DEFAULT_WINDOW, MAX_WINDOW
from switchyard.fleet.spec import role_split
from switchyard.messages.agent import DEFAULT_ACTION_FORMAT
from switchyard.vlmgeometry import DEFAULT_VLM

if TYPE_CHECKING:
    from switchyard.bench.agentsearch import CapacityReport, Slo

DEFAULT_LADDER = "10,25,50,100,200,400,600,800"
# What a search on this project's 2-core machine needs to keep up (loop efficiency
# >= 0.99): the sim's wall clock slowed 4 x, so the fleet's CPU work per step is small
# beside a step's modelled time, and two frames per phone drawn before the run (cycled,
# `agentsim.POOL_LOOKS` sets shared), so nothing is drawn or decoded while they play.
# Measured with 720p frames, one action of 1.2 s per step: 0.991-0.996 from 2 to 100
# phones (up to 69 steps/s modelled, 17 wall), with other jobs on the machine.
SEARCH_DELAY_SCALE = 4.0
SEARCH_FRAME_POOL = 2
# A phone's action (a tap and the game's animation) until it can be captured again: the
# cadence of the seeds' cloud phones ([S0] 2.3, 1-1.5 s per action); 0 = no wait.
DEFAULT_ACT_MS = 1200.0


def agent_sim(
    phones: int = typer.Option(8, min=1, help="concurrent episodes"),
    steps: int = typer.Option(10, min=1, max=256, help="steps per episode"),
    engine: str = typer.Option("llamacpp", help="llamacpp or sim (the GPU simulator)"),
    workers: int | None = typer.Option(None, min=1, help="default: 8 for sim, 1 otherwise"),
    resolution: str = typer.Option("1280x720", "--resolution", "--frame-size", help="frame WxH"),
    max_pixels: int = typer.Option(
        1280 * 720,
        min=28 * 28,
        help="pixels the model sees of a frame (the started preprocessor's SY_MAX_PIXELS; "
        "with --nats, the running fleet's); fewer = fewer visual tokens to prefill",
    ),
    stale_after: float | None = typer.Option(
        None, help="wall s; default 2 x delay scale (sim), 60 (llamacpp)"
    ),
    max_tokens: int | None = typer.Option(
        None, min=8, max=512, help="default: what the action format and chunk need"
    ),
    vlm: str = typer.Option(
        DEFAULT_VLM,
        help="VLM profile qwen3-vl|qwen2.5-vl: visual-token size and answer coordinates "
        "(the started preprocessor's SY_AGENT_VLM and sim workers' SY_SIM_VLM; with "
        "--nats, the running fleet's)",
    ),
    layout: str = typer.Option(
        DEFAULT_LAYOUT,
        help="prompt layout window|single|pair (the started preprocessor's; with "
        "--nats, the running fleet's)",
    ),
    window: int = typer.Option(
        DEFAULT_WINDOW, min=1, max=MAX_WINDOW, help="--layout window: frames per window"
    ),
    action_format: str = typer.Option(
        DEFAULT_ACTION_FORMAT, help="answers as compact lines, grid lines or json"
    ),
    gpu: str | None = typer.Option(
        None, help="sim calibration a100|h100|rtx5090 of the started workers (SY_SIM_GPU)"
    ),
    precision: str | None = typer.Option(
        None, help="sim precision bf16|fp8 (W8A8) of the started workers (SY_SIM_PRECISION)"
    ),
    budget: int | None = typer.Option(
        None,
        min=64,
        help="sim: tokens per engine step, max_num_batched_tokens of the started "
        "workers (SY_SIM_MAX_NUM_BATCHED_TOKENS); default the agent pool's for --gpu "
        "(512 on rtx5090), else the sim's (8192)",
    ),
    scheduling: str | None = typer.Option(
        None,
        help="sim: scheduling policy fcfs|priority of the started workers "
        "(SY_SIM_SCHEDULING_POLICY; priority = earliest due step first); default the sim's",
    ),
    roles: str | None = typer.Option(
        None,
        help="the started workers' roles, e.g. 6p2d: 6 prefill then 2 decode workers "
        "(disaggregated; --workers defaults to their count); default all both. With "
        "--search: auto (colocated and 1..workers/2 decode workers) or a list (8b,6p2d), "
        "one search each, and the best",
    ),
    chunk: int = typer.Option(1, min=1, max=5, help="actions per answer"),
    act_ms: float = typer.Option(
        DEFAULT_ACT_MS, min=0.0, help="modelled ms one action takes on the phone"
    ),
    asynchronous: bool = typer.Option(
        False, "--async", help="send the next step while the chunk executes"
    ),
    lead_ms: float | None = typer.Option(
        None, min=0.0, help="--async: send it this long before the chunk ends (default act-ms)"
    ),
    clock_skew: float = typer.Option(0.0, help="the phones' clock minus the fleet's, s"),
    scatter: bool = typer.Option(False, help="new partition key per step (no affinity)"),
    nats_url: str | None = typer.Option(None, "--nats", help="a running fleet; start nothing"),
    delay_scale: float | None = typer.Option(
        None,
        min=0.0,
        help="sim: wall s per modelled s (SY_SIM_DELAY_SCALE of started "
        f"workers); default 1, {SEARCH_DELAY_SCALE:g} with --search",
    ),
    frame_pool: int | None = typer.Option(
        None,
        min=0,
        max=64,
        help="frames drawn per phone before the run, then cycled; 0 = "
        f"live; default 0, {SEARCH_FRAME_POOL} with --search",
    ),
    stagger: float | None = typer.Option(
        None,
        min=0.0,
        help="wall s over which phones start; default 0, or with --search "
        "one step cadence (chunk x act-ms + 0.5 s, x delay scale)",
    ),
    ramp_steps: int | None = typer.Option(
        None,
        min=0,
        help="steps per phone left out of the percentiles; default 0, or 1 "
        "with --search and 3+ steps",
    ),
    search: bool = typer.Option(False, help="capacity search over --loads (sim engine)"),
    loads: str = typer.Option(DEFAULT_LADDER, help="--search: phone counts to climb"),
    slo: str = typer.Option(
        "step",
        help="--search: objective step (modelled step p99) or stall (with --chunk K "
        "--async: p99 of a phone standing between chunks, no stale answer executed)",
    ),
    target_ms: float | None = typer.Option(
        None, help="--search: the objective's p99 target, ms; default 500 (step), 100 (stall)"
    ),
    search_step: int = typer.Option(5, min=1, help="--search: bisect until this close"),
    budgets: str | None = typer.Option(
        None,
        help="--search: one search per token budget (e.g. 256,512,1024,2048,8192), and the best",
    ),
    min_loop_efficiency: float = typer.Option(
        0.99, min=0.0, max=1.0, help="--search: a load the harness kept up with less fails"
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """N phones: step -> action chunk loops; latency, staleness, prefix reuse, capacity."""
    from switchyard.agentactions import ACTION_FORMATS
    from switchyard.agentprompt import LAYOUTS
    from switchyard.bench.agentsearch import (
        SLO_TARGET_MS,
        SLOS,
        role_splits,
        run_budget_search,
        run_capacity_search,
        run_role_search,
    )
    from switchyard.bench.agentsim import AgentSimConfig, AgentSimConfigError, run_agent_sim
    from switchyard.capacity.calibration import PRECISIONS, SIM_GPUS
    from switchyard.vlmgeometry import VLM_NAMES

    if vlm not in VLM_NAMES:
        raise typer.BadParameter(f"one of {', '.join(VLM_NAMES)}", param_hint="--vlm")
    if layout not in LAYOUTS:
        raise typer.BadParameter(f"one of {', '.join(LAYOUTS)}", param_hint="--layout")
    if action_format not in ACTION_FORMATS:
        raise typer.BadParameter(f"one of {', '.join(ACTION_FORMATS)}",
                                 param_hint="--action-format")  # fmt: skip
    if gpu is not None and gpu not in SIM_GPUS:
        raise typer.BadParameter(f"one of {', '.join(SIM_GPUS)}", param_hint="--gpu")
    if precision is not None and precision not in PRECISIONS:
        raise typer.BadParameter(f"one of {', '.join(PRECISIONS)}", param_hint="--precision")
    if slo not in SLOS:
        raise typer.BadParameter(f"one of {', '.join(SLOS)}", param_hint="--slo")
    objective: Slo = slo  # narrowed by the check above
    target = target_ms if target_ms is not None else SLO_TARGET_MS[objective]
    w, _, h = resolution.partition("x")
    # One split runs (or is searched) as given; `auto` or a list is a search per split.
    many = roles is not None and (roles == "auto" or "," in roles)
    if many and not search:
        raise typer.BadParameter("auto or a list needs --search", param_hint="--roles")
    split = None if many else roles
    sim = engine == "sim"
    scale = delay_scale if delay_scale is not None else (SEARCH_DELAY_SCALE if search else 1.0)
    scale = scale if sim else 1.0
    # One step's cadence in wall seconds: phones spread over it start at every phase.
    cadence = (chunk * act_ms / 1000 + 0.5) * scale
    try:
        cfg = AgentSimConfig(
            phones=phones, steps=steps, engine=engine,
            workers=workers or _role_count(split) or (8 if sim else 1),
            width=int(w), height=int(h), roles=split,
            max_pixels=max_pixels, vlm=vlm,
            # llama.cpp on a CPU serves one step at a time: a 2 s budget would drop most.
            # A slowed sim clock (delay scale) stretches the wall budget with it.
            stale_after=stale_after or (2.0 * max(scale, 1.0) if sim else 60.0),
            max_tokens=max_tokens, scatter=scatter, nats_url=nats_url, delay_scale=scale,
            frame_pool=frame_pool if frame_pool is not None else
            (SEARCH_FRAME_POOL if search else 0),
            stagger_s=stagger if stagger is not None else (cadence if search else 0.0),
            layout=layout, window=window,
            action_format=action_format, gpu=gpu,
            precision=precision,
            max_num_batched_tokens=budget,
            scheduling_policy=scheduling,  # type: ignore[arg-type]  # checked by the config
            chunk=chunk, act_ms=act_ms, asynchronous=asynchronous, lead_ms=lead_ms,
            clock_skew_s=clock_skew,
            ramp_steps=ramp_steps if ramp_steps is not None else
            (1 if search and steps >= 3 else 0),
        )  # fmt: skip
    except AgentSimConfigError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if budgets is not None and not search:
        raise typer.BadParameter("needs --search", param_hint="--budgets")
    if search:
        ladder = sorted({int(n) for n in loads.split(",") if n.strip()})
        if many and roles is not None:
            if budgets is not None:
                raise typer.BadParameter("one of --budgets and a --roles search",
                                         param_hint="--roles")  # fmt: skip
            splits = role_splits(cfg.workers) if roles == "auto" else roles.split(",")
            try:
                for named in splits:
                    role_split(named)
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint="--roles") from exc
            by_roles = run_role_search(cfg, splits, ladder, target, search_step,
                                       min_loop_efficiency, objective)  # fmt: skip
            _print_searches(by_roles.as_dict() if as_json else None, by_roles.searches, "roles",
                            by_roles.capacity_phones, by_roles.roles)  # fmt: skip
            return
        if budgets is not None:
            each = sorted({int(n) for n in budgets.split(",") if n.strip()})
            if not each or min(each) < 64:
                raise typer.BadParameter("token budgets >= 64 (the sim's max_num_seqs)",
                                         param_hint="--budgets")  # fmt: skip
            found = run_budget_search(cfg, each, ladder, target, search_step,
                                      min_loop_efficiency, objective)  # fmt: skip
            _print_searches(found.as_dict() if as_json else None, found.searches,
                            "token budgets", found.capacity_phones, found.best_budget)  # fmt: skip
            return
        report = run_capacity_search(
            cfg, ladder, target, search_step, min_loop_efficiency, objective
        )
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
    mode = "async" if c.asynchronous else "sync"
    table = Table(
        title=f"agent capacity: {c.workers} {c.engine} workers ({report.calibration or '?'}), "
        f"{c.width}x{c.height} frames ({c.vlm}), layout {c.layout}, {c.action_format} answers, "
        f"{mode} chunk {c.chunk} x {c.act_ms:g} ms, {c.steps} steps/phone, delay scale "
        f"{c.delay_scale}, token budget {c.token_budget or 'default'}, "
        f"{c.scheduling_policy or 'default'} scheduling"
    )
    cols = ("phones", "steps", "ok", "stale", "sup", "err", "model p50", "model p99",
            "p99 tail: queue", "prefill", "decode", "steps/s", "GPU prefill", "wait",
            "loop eff", "outside p50", "max/worker", "KV evicted", "stall p99", "starved",
            "pass")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="right")
    for r in report.loads:
        m = r.modelled
        t = m.tail_parts_ms if m else {}
        queue = round(t.get("router", 0) + t.get("dispatch", 0) + t.get("engine_queue", 0), 1)
        busy = f"{round(r.prefill_busy * 100)} %" if r.prefill_busy is not None else "-"
        table.add_row(
            str(r.phones), str(r.steps), str(r.ok), str(r.stale), str(r.superseded),
            str(sum(r.errors.values())),
            f"{m.p50_ms}" if m else "-", f"{m.p99_ms}" if m else "-",
            f"{queue}" if m else "-", f"{t.get('prefill', '-')}", f"{t.get('decode', '-')}",
            f"{r.steps_per_s}", busy, f"{round(r.wait_share * 100)} %",
            f"{m.loop_efficiency}" if m else "-", f"{m.outside_p50_ms}" if m else "-",
            str(r.phones_per_worker_max), str(r.active_evictions), f"{r.stall_p99_ms}",
            f"{round(r.starved_share * 100)} %", "yes" if r.passed else "no",
        )  # fmt: skip
    con = Console()
    con.print(table)
    at = report.at_capacity
    if at is None or at.modelled is None or report.capacity_phones is None:
        con.print(f"capacity: below {report.loads[0].phones} phones ({report.loads[0].reason})")
    else:
        n = report.capacity_phones
        figure = at.modelled.p99_ms if report.slo == "step" else at.stall_p99_ms
        ratio = round(figure / report.target_p99_ms, 2) if report.target_p99_ms else "-"
        con.print(
            f"capacity ({report.slo} p99 <= {report.target_p99_ms:.0f} ms): {n} phones "
            f"({n / c.workers:.0f} per worker) with modelled step p50 {at.modelled.p50_ms} "
            f"ms, p99 {at.modelled.p99_ms} ms, stall p50 {at.stall_p50_ms} / p99 "
            f"{at.stall_p99_ms} ms ({ratio} x the target, "
            f"{round(at.starved_share * 100)} % of chunks ended without a successor); "
            f"{at.actions_per_phone_s} actions per phone per s, "
            f"{round(at.wait_share * 100)} % of phone time waiting on inference"
        )
    con.print(f"limit: {report.limit}: {report.limit_detail}")
    if report.first_failure is not None:
        con.print(
            f"first failure: {report.first_failure.phones} phones: {report.first_failure.reason}"
        )
    for note in report.notes:
        con.print(f"note: {note}")
    con.print(f"search took {report.wall_s} s")


def register(app: typer.Typer) -> None:
    app.command("agent-sim")(agent_sim)


def _print_searches(
    as_json: dict[str, object] | None, searches: Sequence[CapacityReport], what: str,
    capacity: Mapping[Any, int | None], best: object,
) -> None:  # fmt: skip
    """A search per setting (budgets, role splits): the JSON object when given, else each
    search's table and one line of the capacity per setting and the best."""
    if as_json is not None:
        print(json.dumps(_finite(as_json)))
        return
    for one in searches:
        _print_search(one)
    each = ", ".join(f"{k}: {n or 0} phones" for k, n in capacity.items())
    Console().print(f"{what}: {each}; best {best}")


def _role_count(roles: str | None) -> int:
    """Workers a role split names (0: none given, or not a split: the config says why)."""
    if roles is None:
        return 0
    try:
        return len(role_split(roles))
    except ValueError:
        return 0
