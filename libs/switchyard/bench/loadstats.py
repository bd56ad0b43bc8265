"""One load run in numbers: latency percentiles, throughput, errors by class, goodput.

Goodput ([S4] §1.2): requests completed within every SLO per second - an answer
that came too late or not at all is worth nothing to its user, however many
tokens it made. A request is *good* when it succeeded, its TTFT <= the TTFT SLO
and its TPOT <= the TPOT SLO (a one-token answer has no TPOT and passes that
part). The run meets its success SLO when the good fraction of all measured
requests reaches `success` (e.g. 0.99).

Latency percentiles cover the measured requests (due after the warm-up), however
late they finished. Throughput and goodput count every answer that arrived between
the end of the warm-up and the last measured request's answer, whatever its due
time, per second of that span. Below capacity that is the arrival rate (the
warm-up's late answers stand in for the measured ones still in flight at the end);
above it the fleet works through its backlog at its service rate for the whole
span, so the rate is measured over many answers instead of a few seconds' worth.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from switchyard.bench.loadgen import Record
from switchyard.bench.stats import Report, percentile

LOST = frozenset({"client_timeout", "transport"})  # no answer from the fleet at all


@dataclass(frozen=True)
class Slo:
    ttft_ms: float = 1000.0
    tpot_ms: float = 100.0
    success: float = 0.99  # the good fraction a run must reach

    def __post_init__(self) -> None:
        if self.ttft_ms <= 0 or self.tpot_ms <= 0 or not 0 < self.success <= 1:
            raise ValueError("SLO TTFT/TPOT must be > 0 ms and success in (0, 1]")

    def good(self, r: Record) -> bool:
        if not r.ok or r.ttft is None or r.ttft * 1000 > self.ttft_ms:
            return False
        return r.tpot is None or r.tpot * 1000 <= self.tpot_ms


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float
    n: int

    @classmethod
    def of_ms(cls, seconds: Sequence[float]) -> Percentiles:
        ms = [s * 1000 for s in seconds]
        p50, p90, p99 = (round(percentile(ms, q), 2) for q in (0.5, 0.9, 0.99))
        return cls(p50=p50, p90=p90, p99=p99, n=len(ms))


@dataclass
class RunStats(Report):
    label: str
    load: float  # the x axis of a sweep: offered req/s (open loop) or users (closed)
    open_loop: bool
    requests: int  # measured (due after the warm-up)
    warmup_requests: int
    ok: int
    errors: dict[str, int]
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    itl_ms: Percentiles
    e2e_ms: Percentiles  # from each request's due time
    e2e_mean_ms: float
    span_s: float  # end of the warm-up -> the last measured answer
    throughput_rps: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    goodput_rps: float
    good_fraction: float
    slo: Slo
    slo_met: bool
    mean_in_flight: float  # Little's law: requests in the system on average
    send_lag_ms: Percentiles  # sent - due: the harness keeping its schedule
    by_kind: dict[str, int] = field(default_factory=dict)
    error_examples: dict[str, str] = field(default_factory=dict)  # class -> one request's detail
    e2e_sample_ms: list[float] = field(default_factory=list)  # every measured ok request


def summarise(
    records: Sequence[Record], *, label: str, load: float, open_loop: bool, warmup_s: float,
    duration_s: float, slo: Slo,
) -> RunStats:  # fmt: skip
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    # A request the harness gave up on marks when it stopped waiting, not an answer: it
    # must not stretch the span (one lost request would otherwise dilute the rate).
    answered = [r.finish for r in measured if r.finish is not None and r.outcome not in LOST]
    end = max(answered, default=warmup_s + duration_s)
    span = max(end - warmup_s, 1e-9)
    in_window = [r for r in records if r.finish is not None and warmup_s <= r.finish <= end]
    done_ok = [r for r in in_window if r.ok]
    good = [r for r in measured if slo.good(r)]
    e2e_all = [r.e2e for r in measured if r.e2e is not None]
    e2e_ok = [r.e2e for r in ok if r.e2e is not None]
    good_fraction = len(good) / len(measured) if measured else 0.0
    return RunStats(
        label=label, load=load, open_loop=open_loop, requests=len(measured),
        warmup_requests=len(records) - len(measured), ok=len(ok),
        errors=dict(Counter(r.outcome for r in measured if not r.ok)),
        ttft_ms=Percentiles.of_ms([t for r in ok if (t := r.ttft) is not None]),
        tpot_ms=Percentiles.of_ms([t for r in ok if (t := r.tpot) is not None]),
        itl_ms=Percentiles.of_ms([g for r in ok for g in r.itl]),
        e2e_ms=Percentiles.of_ms(e2e_ok),
        e2e_mean_ms=round(statistics.fmean(e2e_ok) * 1000, 2) if e2e_ok else 0.0,
        span_s=round(span, 3),
        throughput_rps=round(len(done_ok) / span, 3),
        input_tokens_per_s=round(sum(r.input_tokens for r in done_ok) / span, 1),
        output_tokens_per_s=round(sum(r.output_tokens for r in done_ok) / span, 1),
        goodput_rps=round(sum(slo.good(r) for r in in_window) / span, 3),
        good_fraction=round(good_fraction, 4),
        slo=slo, slo_met=bool(measured) and good_fraction >= slo.success,
        # Little's law: L = lambda x W, with lambda the measured requests' arrival rate.
        mean_in_flight=round(len(measured) / duration_s * statistics.fmean(e2e_all), 2)
        if e2e_all else 0.0,
        send_lag_ms=Percentiles.of_ms([t for r in measured if (t := r.send_lag) is not None]),
        by_kind=dict(Counter(r.kind for r in measured)),
        error_examples=_examples(measured),
        e2e_sample_ms=sorted(round(e * 1000, 2) for e in e2e_ok),
    )  # fmt: skip


def _examples(records: Sequence[Record]) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in records:
        if not r.ok and r.outcome not in out:
            out[r.outcome] = f"{r.kind} #{r.index} due {r.intended:.2f}s: {r.detail}"[:300]
    return out
