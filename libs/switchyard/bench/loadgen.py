"""The load runner: sends each request at its due time and records what happened to it.

No coordinated omission: in an open loop every request is launched as its own task
at its due time, whether or not earlier ones were answered, and its latency is
measured from the time it was *due*, not from when it went out. A fleet (or this
harness) that stalls therefore shows the stall in the latency of every request
that was due during it. `sent - intended` is recorded too, so a harness that
cannot keep up with its own schedule is visible rather than hidden.

Times in a `Record` are seconds since the run's start (`time.perf_counter`).
Warm-up requests (due before `warmup_s`) are run and recorded but flagged, and the
summaries leave them out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from switchyard.bench.arrival import Arrival, schedule
from switchyard.bench.workloads import RequestSpec, Workload


@dataclass
class Record:
    index: int
    kind: str
    intended: float  # due
    warmup: bool
    sent: float | None = None  # the request left this process
    first: float | None = None  # the first token (chat, agent) or stage event (sql)
    finish: float | None = None  # the answer, or the error, arrived
    token_times: list[float] = field(default_factory=list)  # each streamed chunk
    outcome: str = "pending"  # "ok" or an error class, see `error_class`
    detail: str = ""
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def e2e(self) -> float | None:
        return None if self.finish is None else self.finish - self.intended

    @property
    def ttft(self) -> float | None:
        at = self.first if self.first is not None else (self.finish if self.ok else None)
        return None if at is None else at - self.intended

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; None with fewer than two tokens."""
        if self.first is None or self.finish is None or self.output_tokens < 2:
            return None
        return (self.finish - self.first) / (self.output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]

    @property
    def send_lag(self) -> float | None:
        return None if self.sent is None else self.sent - self.intended

    def arrived(self, at: float) -> None:
        """A streamed chunk (for a question, a stage event) came at `at`: the first, its TTFT."""
        if self.first is None:
            self.first = at
        self.token_times.append(at)


# The fleet's error codes (ErrorInfo.code) as the classes a capacity report counts.
_CODE_CLASS = {
    "over_quota": "429", "no_capacity": "503", "expired": "504", "timeout": "504",
    "stale": "stale",
}  # fmt: skip
_STATUS_CLASS = {429: "429", 503: "503", 504: "504"}


def error_class(code: str | None, http_status: int | None = None) -> str:
    """`429`, `503`, `504`, `stale`, or `http_<status>` / the fleet's code for the rest."""
    if code in _CODE_CLASS:
        return _CODE_CLASS[code]
    if http_status in _STATUS_CLASS:
        return _STATUS_CLASS[http_status]
    if http_status is not None and http_status != 200:
        return f"http_{http_status}" + (f":{code}" if code else "")
    return code or "error"


class Clock:
    """Run-relative seconds, and the wall time of a run-relative instant."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.wall0 = time.time()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def wall(self, at: float) -> float:
        return self.wall0 + at


class Target(Protocol):
    """Sends one request and fills `rec`'s sent/first/token_times/finish/outcome/tokens."""

    async def send(self, spec: RequestSpec, rec: Record, clock: Clock) -> None: ...


@dataclass(frozen=True)
class LoadConfig:
    arrival: Arrival
    duration_s: float = 30.0  # measured
    warmup_s: float = 5.0  # run before it, not measured
    seed: int = 0
    request_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.warmup_s < 0 or self.request_timeout_s <= 0:
            raise ValueError("duration and request timeout must be > 0, warm-up >= 0")


@dataclass
class Hooks:
    """Progress callbacks (the CLI's rich bar); both optional."""

    on_sent: Callable[[Record], None] | None = None
    on_done: Callable[[Record], None] | None = None


async def _one(
    target: Target, spec: RequestSpec, rec: Record, clock: Clock, timeout: float, hooks: Hooks
) -> None:
    try:
        async with asyncio.timeout(timeout):
            await target.send(spec, rec, clock)
    except TimeoutError:
        rec.outcome, rec.detail = "client_timeout", f"no answer within {timeout}s"
    except Exception as exc:  # a transport failure is a result of the run, not a crash
        rec.outcome, rec.detail = "transport", f"{type(exc).__name__}: {exc}"[:300]
    if rec.finish is None:
        rec.finish = clock.now()
    if rec.outcome == "pending":
        rec.outcome, rec.detail = "error", "the target returned without an outcome"
    if hooks.on_done:
        hooks.on_done(rec)


async def run_load(
    target: Target, workload: Workload, cfg: LoadConfig, hooks: Hooks | None = None
) -> list[Record]:
    """Every request of one run (warm-up included, flagged), in the order they were due."""
    hooks = hooks or Hooks()
    if cfg.arrival.open:
        return await _open_loop(target, workload, cfg, hooks)
    return await _closed_loop(target, workload, cfg, hooks)


async def _open_loop(
    target: Target, workload: Workload, cfg: LoadConfig, hooks: Hooks
) -> list[Record]:
    due = schedule(cfg.arrival, cfg.warmup_s + cfg.duration_s, cfg.seed)
    specs = workload.take(len(due))  # drawn before the clock starts: no generation on the path
    records = [
        Record(s.index, s.kind, at, warmup=at < cfg.warmup_s)
        for s, at in zip(specs, due, strict=True)
    ]
    tasks: list[asyncio.Task[None]] = []
    clock = Clock()
    for spec, rec in zip(specs, records, strict=True):
        delay = rec.intended - clock.now()
        if delay > 0:
            await asyncio.sleep(delay)
        # A task per request: nothing here ever waits for an answer before the next send.
        tasks.append(
            asyncio.create_task(_one(target, spec, rec, clock, cfg.request_timeout_s, hooks))
        )
        if hooks.on_sent:
            hooks.on_sent(rec)
    await asyncio.gather(*tasks)
    return records


async def _closed_loop(
    target: Target, workload: Workload, cfg: LoadConfig, hooks: Hooks
) -> list[Record]:
    end = cfg.warmup_s + cfg.duration_s
    records: list[Record] = []
    clock = Clock()

    async def user() -> None:
        while (ready := clock.now()) < end:
            spec = workload.next()
            # A closed-loop request is due when its user is ready: the previous answer
            # arrived and the think time passed. Its latency cannot show a stall that kept
            # the user from sending - the report says a closed loop hides queueing.
            rec = Record(spec.index, spec.kind, ready, warmup=ready < cfg.warmup_s)
            records.append(rec)
            if hooks.on_sent:
                hooks.on_sent(rec)
            await _one(target, spec, rec, clock, cfg.request_timeout_s, hooks)
            if cfg.arrival.think_s:
                await asyncio.sleep(cfg.arrival.think_s)

    await asyncio.gather(*(user() for _ in range(cfg.arrival.concurrency)))
    return sorted(records, key=lambda r: r.intended)
