"""Knee detection on synthetic sweeps, and how a sweep's runs are read (goodput, cost)."""

from __future__ import annotations

import math

import pytest

from switchyard.bench.knee import Knee, KneeError, Point, find_knee
from switchyard.bench.loadgen import Record
from switchyard.bench.loadreport import (
    SweepMeta,
    build_result,
    cost_per_1k,
    finite,
    markdown,
)
from switchyard.bench.loadstats import RunStats, Slo, summarise


def curve(rows: list[tuple[float, float, float]]) -> list[Point]:
    return [Point(load, tput, p99) for load, tput, p99 in rows]


def queue_sweep(loads: list[float], capacity: float, run_s: float = 20.0) -> list[Point]:
    """An M/M/1 fleet of `capacity` req/s: below it, throughput = load and p99 is the
    sojourn time's, -ln(0.01) / (mu - lambda); above it, throughput = capacity and the
    backlog grows for the whole run, adding run_s * overload / capacity to the tail."""
    edge = -math.log(0.01) / (capacity * 0.1) * 1000  # the p99 at 90 % utilisation, ms
    points = []
    for lam in loads:
        if lam < capacity:
            p99 = -math.log(0.01) / (capacity - lam) * 1000
        else:
            p99 = edge + run_s * 1000 * (lam - capacity) / capacity
        points.append(Point(lam, min(lam, capacity), p99))
    return points


def test_knee_of_a_saturating_curve() -> None:
    points = curve([(1, 1, 100), (2, 2, 100), (4, 4, 110), (8, 8, 150), (16, 10, 400),
                    (32, 10.2, 2000)])  # fmt: skip
    knee = find_knee(points)
    assert knee == Knee(index=5, load=32, previous_load=16, throughput_gain=0.02,
                        p99_growth=4.0, recommended_limit=25.6)  # fmt: skip


def test_knee_of_a_queueing_model_is_the_first_load_that_gains_nothing() -> None:
    knee = find_knee(queue_sweep([2, 4, 6, 8, 12, 16, 24], capacity=10.0))
    assert knee is not None
    # 8 -> 12 still gains 25 % (to the capacity, 10); 12 -> 16 gains nothing, the tail grows.
    assert (knee.previous_load, knee.load) == (12, 16)
    assert knee.throughput_gain == 0.0 and knee.p99_growth > 0.5
    assert knee.recommended_limit == pytest.approx(12.8)


def test_no_knee_while_throughput_scales() -> None:
    points = curve([(1, 1, 100), (2, 2, 105), (4, 4, 110), (8, 7.9, 130)])
    assert find_knee(points) is None


def test_no_knee_when_p99_stays_flat_at_a_plateau() -> None:
    # Throughput stopped growing but latency did not jump: a client-side limit, not a knee.
    points = curve([(1, 1, 100), (2, 2, 100), (4, 2.02, 120), (8, 2.03, 140)])
    assert find_knee(points) is None


def test_no_knee_when_p99_jumps_but_throughput_still_grows() -> None:
    points = curve([(1, 1, 100), (2, 2, 300), (4, 4, 900)])
    assert find_knee(points) is None


def test_knee_at_the_last_load() -> None:
    points = curve([(2, 2, 50), (4, 4, 52), (8, 8, 60), (16, 8.1, 400)])
    knee = find_knee(points)
    assert knee is not None and knee.index == 3 and knee.load == 16


def test_a_load_nothing_answered_is_unbounded_growth() -> None:
    points = curve([(2, 2, 50), (4, 4, 52), (8, 0.0, math.inf)])
    knee = find_knee(points)
    assert knee is not None and knee.load == 8 and math.isinf(knee.p99_growth)


def test_no_knee_from_a_load_that_served_nothing() -> None:
    # A fleet that answered nothing at any load has no knee, only errors.
    points = curve([(1, 0.0, math.inf), (2, 0.0, math.inf), (4, 0.0, math.inf)])
    assert find_knee(points) is None


def test_thresholds_are_parameters() -> None:
    points = curve([(1, 1, 100), (2, 1.08, 200)])
    assert find_knee(points) is None  # 8 % gain
    assert find_knee(points, min_gain=0.10) is not None


@pytest.mark.parametrize("loads", [[2, 1], [1, 1], [1, float("nan")]])
def test_bad_sweeps_are_refused(loads: list[float]) -> None:
    with pytest.raises(KneeError):
        find_knee([Point(x, 1, 1) for x in loads])


def test_cost_per_thousand_requests() -> None:
    # $2/GPU-hour, 2 GPUs, 10 req/s: 1,000 requests take 100 s of 2 GPUs = 2 * 2 / 36.
    assert cost_per_1k(2.0, 2, 10.0) == pytest.approx(0.1111, abs=1e-4)
    assert cost_per_1k(2.0, 1, 0.0) is None


def _records(n: int, *, ttft: float, tokens: int, tpot: float, warmup: int = 0) -> list[Record]:
    out = []
    for i in range(n):
        due = i * 0.1
        r = Record(i, "chat", due, warmup=i < warmup, sent=due + 0.001)
        r.first = due + ttft
        r.token_times = [r.first + k * tpot for k in range(tokens)]
        r.finish = r.token_times[-1]
        r.output_tokens, r.input_tokens, r.outcome = tokens, 100, "ok"
        out.append(r)
    return out


def _late(r: Record, ttft: float, tokens: int = 11, tpot: float = 0.02) -> None:
    r.first = r.intended + ttft
    r.token_times = [r.first + k * tpot for k in range(tokens)]
    r.finish = r.token_times[-1]


def test_goodput_counts_only_requests_within_every_slo() -> None:
    # Due every 0.1 s, answered 0.4 s later; 2 warm-up requests (due before 0.2 s).
    recs = _records(10, ttft=0.2, tokens=11, tpot=0.02, warmup=2)
    _late(recs[3], ttft=0.6)  # over the TTFT SLO: answered at 1.1 s
    _late(recs[5], ttft=2.0)  # over it too, and the last answer: 2.7 s
    recs[6].outcome = "429"
    stats = summarise(recs, label="x", load=10, open_loop=True, warmup_s=0.2, duration_s=0.8,
                      slo=Slo(ttft_ms=500, tpot_ms=50, success=0.9))  # fmt: skip
    assert stats.requests == 8 and stats.warmup_requests == 2
    assert stats.ok == 7 and stats.errors == {"429": 1}
    # Latency covers the measured requests however late: request 5's 2 s TTFT is the p99.
    assert stats.ttft_ms.p99 == pytest.approx(2000, abs=0.01)
    assert stats.good_fraction == pytest.approx(5 / 8) and not stats.slo_met
    # Rates: answers from the warm-up's end (0.2 s) to the last measured one (2.7 s), the
    # warm-up's included: 9 ok (not the 429), 7 of them within the SLOs, over 2.5 s.
    assert stats.span_s == pytest.approx(2.5)
    assert stats.throughput_rps == pytest.approx(9 / 2.5)
    assert stats.goodput_rps == pytest.approx(7 / 2.5)
    assert stats.output_tokens_per_s == pytest.approx(9 * 11 / 2.5)
    assert stats.tpot_ms.p50 == pytest.approx(20, abs=0.01)
    assert stats.itl_ms.p99 == pytest.approx(20, abs=0.01)


def _sweep(throughputs: dict[float, float], ttfts: dict[float, float]) -> list[RunStats]:
    slo = Slo(ttft_ms=1000, tpot_ms=100)
    runs = []
    for load, tput in throughputs.items():
        recs = _records(40, ttft=ttfts[load], tokens=5, tpot=0.01)
        stats = summarise(recs, label=f"{load}", load=load, open_loop=True, warmup_s=0,
                          duration_s=4.0, slo=slo)  # fmt: skip
        # The rates as a fleet would show them (the synthetic records share one timeline).
        stats.throughput_rps = tput
        stats.goodput_rps = tput if ttfts[load] * 1000 <= slo.ttft_ms else 0.0
        runs.append(stats)
    return runs


META = SweepMeta(target="NATS", workload="chat", arrival="poisson", fleet="synthetic",
                 replicas=2, gpu_price_per_hour=3.0, duration_s=4, warmup_s=0, seed=1,
                 started_at="now")  # fmt: skip


def test_the_operating_point_never_passes_the_goodput_peak() -> None:
    # 1 -> 2 still gains 14 % (no knee) although 2 is overloaded (TTFT 10 s, goodput 0);
    # the knee lands at 3, and 0.8 x 3 = 2.4 would recommend the overloaded 2.
    runs = _sweep({1: 1.2, 2: 1.37, 3: 0.9}, {1: 0.3, 2: 10.0, 3: 20.0})
    result = build_result(META, runs)
    assert result.knee is not None and result.knee.load == 3
    assert result.goodput_peak_load == 1
    assert result.operating is not None and result.operating.load == 1
    assert "goodput peak 1" in result.operating.basis


def test_a_sweep_report_answers_the_three_questions() -> None:
    # Past the knee (16) the fleet serves no faster than at 8 req/s.
    runs = _sweep({2: 2, 4: 4, 8: 8, 16: 8.1}, {2: 0.1, 4: 0.12, 8: 0.15, 16: 3.0})
    result = build_result(META, runs)
    assert result.knee is not None and result.knee.load == 16
    assert result.operating is not None and result.operating.load == 8  # <= 0.8 x 16
    # $3/GPU-hour x 2 GPUs at 8 good req/s: 6 / 3600 / 8 x 1000.
    assert result.operating.cost_per_1k_requests == pytest.approx(0.2083, abs=1e-4)
    text = markdown(result)
    assert "Safe concurrency per replica" in text and "Its p99" in text
    assert "Cost per 1,000 requests" in text and "Knee: **16" in text
    assert finite({"a": [math.inf, 1.0]}) == {"a": [None, 1.0]}
