"""`sy agent-sim --search`: the largest phone count that meets a service-level objective.

One fleet (started, or `--nats`) serves a ladder of loads, climbed until one
fails, then bisected (`next_load`). The objective (`Slo`) is either

- `step` (the default): the modelled step p99 within the target (500 ms), or
- `stall`: what the phone feels with chunks (`--chunk K --async`): the p99 of how long
  a phone stands after a chunk ends with no next action (`AgentSimReport.stall_p99_ms`)
  within the target (100 ms). No stale answer is executed under either: the fleet
  withholds one ready too late, the phone refuses one that reached it too late
  (`AgentSimReport.refused_late`), and the wait for a fresh one is part of the stall.

A load passes (`judge`) only when

- the harness kept up: loop efficiency >= `min_loop_efficiency` (0.99 by
  default), so the phones really offered the load of N phones - a capacity is
  never reported at a load this machine could not produce;
- `step`: every step was answered ok (a step not ok counts as infinitely late; a
  superseded one, the phone's own choice, does not count) and the modelled p99
  is within the target; `stall`: the stall p99 is within it;
- no answer was invalid in the step's action format, and none was cut;
- no step's admission evicted KV blocks of an active session (the sim's count,
  `engines.sim` "Active sessions"): past its KV, a fleet recomputes prefixes of phones
  still playing, a wall the p99 shows only later.

What limited the result (`limit`), from the first load that failed above the
capacity (`limit_of`): `harness` (this machine, not the fleet: the capacity is a
lower bound), `invalid actions`, `cut answers`, `KV capacity`, `prefill saturation` (the GPUs
spent at least `SATURATED` of their modelled time on prefill: every step
carries a new frame, and prefill is compute-bound), else the largest part of the
failing tail - `prefill`, `decode` or `queueing`; `ladder` when every load
passed (the capacity is at least the top rung).

With several per-step token budgets (`sy agent-sim --search --budgets`), the search
runs once per budget (the sim workers' `max_num_batched_tokens`) and names the best
(`best_budget`, by `best_setting`): the most phones, then the lower p99 at capacity, then the larger
budget (fewer engine steps per prefill). A small budget is Sarathi-Serve's stall-free
batching (Agrawal et al., OSDI 2024, arXiv 2403.02310): a step carries decodes and at
most that many prefill tokens, so a frame's prefill no longer stalls every decoding
step for its whole length, at the price of more steps (each with its fixed cost) per
prefill.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Literal, TypeVar, get_args

from switchyard import eventloop
from switchyard.bench.agentsim import (
    POOL_LOOKS,
    AgentSimConfig,
    AgentSimReport,
    ModelledLatency,
    agent_fleet,
    drive,
)
from switchyard.bench.stats import Report
from switchyard.fleet.spec import role_split

# A GPU this busy with prefill has little left for decode steps and none for bursts.
SATURATED = 0.6
DEFAULT_MIN_LOOP_EFFICIENCY = 0.99
Slo = Literal["step", "stall"]
SLOS: tuple[Slo, ...] = get_args(Slo)
# Each objective's default target, ms: a step under 500 ms ([S0] intro); a phone that
# never stands still for longer than 100 ms between chunks (issue #38).
SLO_TARGET_MS: dict[Slo, float] = {"step": 500.0, "stall": 100.0}


@dataclass
class LoadResult:
    phones: int
    steps: int
    ok: int
    stale: int
    errors: dict[str, int]
    invalid_actions: int
    wall_p50_ms: float
    wall_p99_ms: float
    modelled: ModelledLatency | None
    passed: bool
    reason: str
    superseded: int = 0
    cut_answers: int = 0
    steps_per_s: float = 0.0  # modelled, all phones
    prefill_busy: float | None = None  # share of each GPU's modelled time
    wait_share: float = 0.0
    actions_per_phone_s: float = 0.0
    calibration: str | None = None
    phones_per_worker_max: int = 0  # how evenly the load's sessions were placed
    workers_used: int = 0
    active_evictions: int = 0  # KV blocks of active sessions evicted (sim)
    # What the phone felt (`AgentSimReport`): stalls between chunks, modelled ms.
    stall_p50_ms: float = 0.0
    stall_p99_ms: float = 0.0
    starved_share: float = 0.0
    refused_late: int = 0
    switches: int = 0


@dataclass
class CapacityReport(Report):
    """The search's answer first (the figures at capacity), then how it got there."""

    capacity_phones: int | None  # the largest passing load; None if the first load failed
    p50_ms: float | None  # modelled, at capacity
    p99_ms: float | None
    invalid_actions: int | None  # at capacity
    cut_answers: int | None
    active_evictions: int | None
    limit: str  # what limited it, one of the names in the module docstring
    limit_detail: str  # ... in words, with the figures
    calibration: str | None  # what the sim modelled (from the results)
    layout: str
    action_format: str
    chunk: int
    act_ms: float
    asynchronous: bool
    loop_efficiency: float | None  # at capacity
    wait_share: float | None
    actions_per_phone_s: float | None
    steps_per_s: float | None
    prefill_busy: float | None
    slo: Slo
    target_p99_ms: float  # of the objective's figure: the step's p99, or the stall's
    stall_p99_ms: float | None  # at capacity
    at_capacity: LoadResult | None
    first_failure: LoadResult | None
    loads: list[LoadResult]  # in the order run
    config: AgentSimConfig
    wall_s: float
    notes: list[str] = field(default_factory=list)


@dataclass
class BudgetSearch(Report):
    """One capacity search per token budget, and the best of them (`best_budget`)."""

    budgets: list[int]  # in the order searched
    capacity_phones: dict[int, int | None]  # budget -> phones at modelled p99 <= target
    best_budget: int | None  # None when no budget passed its first load
    searches: list[CapacityReport]  # in the order of `budgets`


Setting = TypeVar("Setting", int, str)


def best_setting(results: Sequence[tuple[Setting, int | None, float | None]]) -> Setting | None:
    """Of (setting, phones at capacity, p99 ms there) - a token budget, a role split - the
    setting that served the most phones; ties go to the lower p99, then to the larger
    setting (of budgets, fewer steps per prefill, so less per-step overhead). None if no
    setting passed a load."""
    ranked = [
        (phones, -(p99 if p99 is not None else math.inf), setting)
        for setting, phones, p99 in results
        if phones is not None
    ]
    return max(ranked)[2] if ranked else None


@dataclass
class RoleSearch(Report):
    """One capacity search per role split of the workers (#39), colocated among them."""

    splits: list[str]  # in the order searched; `<n>b` is colocated (every worker both)
    capacity_phones: dict[str, int | None]  # split -> phones at capacity
    roles: str | None  # the best split; None when none passed its first load
    colocated_capacity_phones: int | None  # the colocated split's, from the same run
    searches: list[CapacityReport]  # in the order of `splits`


def role_splits(workers: int) -> list[str]:
    """The splits `--roles auto` searches for `workers` GPUs: colocated, then prefill-heavy
    splits from one decode worker to half of them (an agent answer is a few tokens: its
    decode is light, while every step brings a frame to prefill)."""
    if workers < 2:
        return [f"{workers}b"]
    return [f"{workers}b"] + [f"{workers - d}p{d}d" for d in range(1, workers // 2 + 1)]


def run_role_search(
    cfg: AgentSimConfig, splits: Sequence[str], ladder: Sequence[int], target_ms: float = 500.0,
    resolution: int = 5, min_loop_efficiency: float = DEFAULT_MIN_LOOP_EFFICIENCY,
    slo: Slo = "step",
) -> RoleSearch:  # fmt: skip
    """`run_capacity_search` once per split (`cfg` with its `roles`; `<n>b` colocated)."""
    searches = []
    for split in splits:
        print(f"agent-sim search: roles {split}", file=sys.stderr, flush=True)
        colocated = set(role_split(split)) == {"both"}
        run = replace(cfg, roles=None if colocated else split)
        found = run_capacity_search(run, ladder, target_ms, resolution, min_loop_efficiency, slo)
        searches.append((split, colocated, found))
    colocated_phones = [r.capacity_phones for _, c, r in searches if c]
    return RoleSearch(
        splits=list(splits),
        capacity_phones={split: r.capacity_phones for split, _, r in searches},
        roles=best_setting([(split, r.capacity_phones, r.p99_ms) for split, _, r in searches]),
        colocated_capacity_phones=colocated_phones[0] if colocated_phones else None,
        searches=[r for _, _, r in searches],
    )


def run_budget_search(
    cfg: AgentSimConfig, budgets: Sequence[int], ladder: Sequence[int], target_ms: float = 500.0,
    resolution: int = 5, min_loop_efficiency: float = DEFAULT_MIN_LOOP_EFFICIENCY,
    slo: Slo = "step",
) -> BudgetSearch:  # fmt: skip
    """`run_capacity_search` once per budget (`cfg` with its `max_num_batched_tokens`)."""
    searches = []
    for budget in budgets:
        print(f"agent-sim search: token budget {budget}", file=sys.stderr, flush=True)
        run = replace(cfg, max_num_batched_tokens=budget)
        found = run_capacity_search(run, ladder, target_ms, resolution, min_loop_efficiency, slo)
        searches.append((budget, found))
    return BudgetSearch(
        budgets=list(budgets),
        capacity_phones={b: r.capacity_phones for b, r in searches},
        best_budget=best_setting([(b, r.capacity_phones, r.p99_ms) for b, r in searches]),
        searches=[r for _, r in searches],
    )


def next_load(results: dict[int, bool], ladder: Sequence[int], resolution: int) -> int | None:
    """The next phone count to try, or None when the search is done.

    Climb `ladder` until a load fails, then bisect between the largest passing
    and the smallest failing load until they are `resolution` apart or less, or
    within 10 % of the passing load (finer than a load's own run-to-run noise).
    A load below the first rung that fails ends the search (capacity below it).
    """
    for n in ladder:
        if n not in results:
            return n
        if not results[n]:
            break
    passing = [n for n, ok in results.items() if ok]
    failing = [n for n, ok in results.items() if not ok]
    if not failing:
        return None  # every rung passed: capacity is at least the top rung
    hi = min(failing)
    lo = max((n for n in passing if n < hi), default=0)
    if lo == 0 or hi - lo <= max(resolution, lo // 10):
        return None
    mid = (lo + hi) // 2
    return mid if mid not in results else None


def judge(
    report: AgentSimReport, target_ms: float,
    min_loop_efficiency: float = DEFAULT_MIN_LOOP_EFFICIENCY, slo: Slo = "step",
) -> LoadResult:  # fmt: skip
    m = report.modelled
    if m is None:
        passed, reason = False, "no modelled timings (not a sim fleet?)"
    elif m.loop_efficiency < min_loop_efficiency:
        passed = False
        reason = (
            f"harness-bound: loop efficiency {m.loop_efficiency} < {min_loop_efficiency}, the "
            "phones could not offer this load on this machine (raise --delay-scale)"
        )
    elif report.invalid_actions or report.cut_answers:
        passed = False
        reason = (
            f"{report.invalid_actions} invalid actions, {report.cut_answers} cut answers "
            f"({report.config.action_format}, chunk {report.config.chunk})"
        )
    elif report.active_evictions:
        # The KV is the wall: an active phone's prefix evicted is a whole prefill again
        # at its next step, a fleet running past its memory whatever the p99 says yet.
        passed = False
        reason = f"{report.active_evictions} KV blocks of active sessions evicted"
    elif slo == "stall" and report.stall_p99_ms > target_ms:
        passed = False
        reason = (
            f"stall p99 {report.stall_p99_ms} ms > {target_ms} ms "
            f"({round(report.starved_share * 100)} % of chunks ended without a successor)"
        )
    elif slo == "stall":
        passed = True
        reason = f"stall p99 {report.stall_p99_ms} ms <= {target_ms} ms (step p99 {m.p99_ms} ms)"
    elif m.p99_ms > target_ms:
        late = "not all steps ok" if math.isinf(m.p99_ms) else f"{m.p99_ms} ms"
        passed, reason = False, f"modelled p99 {late} > {target_ms} ms (limit: {m.limit})"
    else:
        passed, reason = True, f"modelled p99 {m.p99_ms} ms <= {target_ms} ms"
    # The report's figures under their own names (`modelled` among them), and these.
    same = {f.name: getattr(report, f.name) for f in fields(LoadResult) if hasattr(report, f.name)}
    return LoadResult(
        **same, phones=report.config.phones, wall_p50_ms=report.latency_p50_ms,
        wall_p99_ms=report.latency_p99_ms, passed=passed, reason=reason,
    )  # fmt: skip


def explain_limit(at: LoadResult | None, fail: LoadResult | None) -> str:
    """What limits capacity, from the p99 tails of the largest passing and first failing load.

    Names the largest component group of the failing tail, and the component that
    grew most between the two loads: a budget mostly spent on a fixed prefill and
    decode can be tipped over by a little queueing, and both are worth knowing.
    """
    src = fail or at
    if src is None or src.modelled is None:
        return "unknown (no modelled timings)"
    if fail is not None and fail.reason.startswith("harness-bound"):
        return f"this machine: {fail.reason}"
    t = src.modelled.tail_parts_ms
    queue = t["router"] + t["dispatch"] + t["engine_queue"]
    where = "beyond capacity" if src is fail else "at the largest load tried"
    text = (
        f"{src.modelled.limit} ({where}, {src.phones} phones, mean of the p99 tail: decode "
        f"{t['decode']} ms, prefill {t['prefill']} ms, queueing {round(queue, 1)} ms = router "
        f"{t['router']} + dispatch {t['dispatch']} + engine queue {t['engine_queue']})"
    )
    alone = src.modelled.tail_decode_alone_ms
    if alone is not None:
        # Compute-bound prefill shares each engine step: a decode step that carries another
        # step's prefill chunk lasts as long as that chunk. Say how much of decode that was.
        text += (
            f"; the tail's answers ({src.modelled.tail_output_tokens} output tokens) would "
            f"decode in {alone} ms alone on the GPU, the other "
            f"{round(max(0.0, t['decode'] - alone), 1)} ms were decode steps shared with "
            "other steps' prefill"
        )
    if src.prefill_busy is not None:
        text += (
            f"; {src.steps_per_s} steps/s, prefill kept each GPU "
            f"{round(src.prefill_busy * 100)} % busy"
        )
    if src.workers_used:
        text += (
            f"; sessions on {src.workers_used} workers, at most {src.phones_per_worker_max} "
            "phones on one"
        )
    if fail is not None and fail.modelled is not None and at is not None and at.modelled:
        before = at.modelled.tail_parts_ms
        growth = {k: t[k] - before[k] for k in t if math.isfinite(t[k] - before[k])}
        if growth:
            grew = max(growth, key=lambda k: growth[k])
            text += (
                f"; from {at.phones} to {fail.phones} phones the tail grew most in {grew} "
                f"(+{round(growth[grew], 1)} ms)"
            )
    return text


def limit_of(at: LoadResult | None, fail: LoadResult | None) -> str:
    """The name of what limited the search (see the module docstring)."""
    if fail is None:
        return "ladder" if at is not None else "unknown"
    if fail.reason.startswith("harness-bound"):
        return "harness"
    if fail.invalid_actions:
        return "invalid actions"
    if fail.cut_answers:
        return "cut answers"
    if fail.active_evictions:
        return "KV capacity"
    if fail.modelled is None:
        return "unknown"
    if fail.prefill_busy is not None and fail.prefill_busy >= SATURATED:
        return "prefill saturation"
    return fail.modelled.limit


def run_capacity_search(
    cfg: AgentSimConfig, ladder: Sequence[int], target_ms: float = 500.0,
    resolution: int = 5, min_loop_efficiency: float = DEFAULT_MIN_LOOP_EFFICIENCY,
    slo: Slo = "step",
) -> CapacityReport:  # fmt: skip
    """Search (`next_load`) on a fleet started for each load, or on `cfg.nats_url`'s.

    A fresh fleet per load, because a fleet remembers the loads before: the router
    keeps every session's worker for `SY_SESSION_TTL` (10 min) and places a new session
    by the sessions each worker holds, ended or not, so after a few loads the phones of
    the next one stack on some workers while others idle. That would measure the
    search's own history, not N phones. A running fleet (`--nats`) is shared by the
    loads, with that caveat (the notes say so).
    """
    t0 = time.perf_counter()
    # Every pool frame stays prepared in the preprocessor across a load.
    sized = replace(cfg, frame_cache=max(cfg.frame_cache, 2 * POOL_LOOKS * cfg.frame_pool))

    def measure(n: int) -> LoadResult:
        load = replace(sized, phones=n)
        with agent_fleet(load) as url:  # a fresh one unless cfg names a running fleet
            report = eventloop.run(drive(load, url))
        res = judge(report, target_ms, min_loop_efficiency, slo)
        # A search takes minutes: say where it is (stderr, so --json stays clean).
        print(f"agent-sim search: {n} phones: {res.reason}", file=sys.stderr, flush=True)
        return res

    loads: list[LoadResult] = []
    passed: dict[int, bool] = {}
    while (n := next_load(passed, ladder, resolution)) is not None:
        loads.append(measure(n))
        passed[n] = loads[-1].passed
    passing = [r for r in loads if r.passed]
    at = max(passing, key=lambda r: r.phones) if passing else None
    above = [r for r in loads if not r.passed and (at is None or r.phones > at.phones)]
    fail = min(above, key=lambda r: r.phones) if above else None
    m = at.modelled if at is not None else None
    calibrations = sorted({r.calibration for r in loads if r.calibration})
    return CapacityReport(
        capacity_phones=at.phones if at else None,
        p50_ms=m.p50_ms if m else None, p99_ms=m.p99_ms if m else None,
        invalid_actions=at.invalid_actions if at else None,
        cut_answers=at.cut_answers if at else None,
        active_evictions=at.active_evictions if at else None,
        limit=limit_of(at, fail), limit_detail=explain_limit(at, fail),
        calibration=",".join(calibrations) or None,
        layout=cfg.layout, action_format=cfg.action_format, chunk=cfg.chunk,
        act_ms=cfg.act_ms, asynchronous=cfg.asynchronous,
        loop_efficiency=m.loop_efficiency if m else None,
        wait_share=at.wait_share if at else None,
        actions_per_phone_s=at.actions_per_phone_s if at else None,
        steps_per_s=at.steps_per_s if at else None,
        prefill_busy=at.prefill_busy if at else None,
        slo=slo, target_p99_ms=target_ms, stall_p99_ms=at.stall_p99_ms if at else None,
        at_capacity=at, first_failure=fail, loads=loads,
        config=sized, wall_s=round(time.perf_counter() - t0, 1),
        notes=[
            (
                "pass: modelled p99 <= target with every step answered ok (a step not ok "
                "counts as infinitely late)" if slo == "step" else
                "pass: stall p99 (a phone standing after a chunk ended, until its next "
                "fresh answer) <= target"
            )
            + ", no invalid or cut answer, no KV block of an active session evicted, loop "
            f"efficiency >= {min_loop_efficiency} (the harness kept up)",
            "modelled = router + dispatch (measured wall / delay_scale) + the sim engine's "
            "modelled queue, prefill, decode; wall figures include this machine's CPU work",
            f"phones: {cfg.steps} steps each, "
            f"{'async' if cfg.asynchronous else 'sync'}, chunk {cfg.chunk} x {cfg.act_ms:g} ms, "
            f"delay scale {cfg.delay_scale:g}, frame pool {cfg.frame_pool}, starts spread "
            f"over {cfg.stagger_s:g} wall s, first {cfg.ramp_steps} step(s) left out of "
            "the percentiles",
            f"resolution: bisection stops when pass and fail are <= {resolution} phones or "
            "10 % apart",
            "each load ran on a fleet started for it" if cfg.nats_url is None else
            "every load ran on the fleet at --nats: sessions of earlier loads still count "
            "for the placement of new ones (SY_SESSION_TTL)",
        ],
    )  # fmt: skip
