"""The peers harness's statistics on synthetic input."""

from __future__ import annotations

import asyncio

import pytest

from switchyard.bench.peers.clients import Outcome
from switchyard.bench.peers.rounds import interleave
from switchyard.bench.peers.stats import (
    HITS,
    QUERIES,
    Latency,
    MetricsParseError,
    delta,
    hit_rate,
    imbalance,
    parse_metrics,
)

EXPOSITION = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{model_name="sim"} 1200.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{finished_reason="length",model_name="sim"} 3.0
vllm:request_success_total{finished_reason="stop",model_name="sim"} 4.0
vllm:num_requests_running{model_name="sim"} 2
plain_metric 7 1700000000000
"""


def test_parse_metrics_sums_label_sets_and_keeps_names() -> None:
    m = parse_metrics(EXPOSITION)
    assert m[QUERIES] == 1200.0
    assert m["vllm:request_success_total"] == 7.0  # both finished reasons
    assert m["vllm:num_requests_running"] == 2.0
    assert m["plain_metric"] == 7.0  # the timestamp is not the value


def test_parse_metrics_refuses_garbage() -> None:
    with pytest.raises(MetricsParseError, match="not-a-number"):
        parse_metrics('vllm:x{a="b"} not-a-number')
    with pytest.raises(MetricsParseError, match="lonely_name"):
        parse_metrics("lonely_name")


def test_hit_rate_is_token_weighted_over_counter_deltas() -> None:
    # Backend 0 served many tokens with few hits, backend 1 few tokens all hit: a mean of
    # per-backend rates would say 52.5 %, the token-weighted rate is 150 / 1100.
    before = [{QUERIES: 500.0, HITS: 100.0}, {QUERIES: 0.0, HITS: 0.0}]
    after = [{QUERIES: 1500.0, HITS: 150.0}, {QUERIES: 100.0, HITS: 100.0}]
    assert hit_rate(before, after) == pytest.approx(150 / 1100)
    # What was there before the run does not count.
    assert hit_rate(after, after) == 0.0


def test_a_counter_going_backwards_is_an_error() -> None:
    with pytest.raises(ValueError, match="backwards"):
        delta({QUERIES: 10.0}, {QUERIES: 5.0}, QUERIES)
    with pytest.raises(ValueError, match="scrapes"):
        hit_rate([{}], [{}, {}])


def test_imbalance_is_max_over_mean() -> None:
    assert imbalance([10, 10, 10, 10]) == 1.0
    assert imbalance([40, 0, 0, 0]) == 4.0
    assert imbalance([30, 10, 10, 10]) == pytest.approx(2.0)
    assert imbalance([]) == 0.0
    assert imbalance([0, 0]) == 0.0
    with pytest.raises(ValueError):
        imbalance([1, -1])


def test_latency_percentiles_are_nearest_rank_in_ms() -> None:
    seconds = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    lat = Latency.of(seconds)
    assert lat.n == 100
    assert lat.p50_ms == 50.0
    assert lat.p99_ms == 99.0
    assert lat.mean_ms == pytest.approx(50.5)
    assert Latency.of([]) == Latency(0, 0.0, 0.0, 0.0)


def test_interleave_rotates_columns_and_counts_every_request() -> None:
    order: list[str] = []

    def column(name: str, fail_on: int | None = None):  # type: ignore[no-untyped-def]
        async def send(i: int) -> Outcome:
            if i >= 0:
                order.append(name)
            await asyncio.sleep(0)
            if i == fail_on:
                raise RuntimeError("boom")
            return Outcome(total_s=0.001 * (1 + (name == "b")))

        return send

    records = asyncio.run(
        interleave({"a": column("a"), "b": column("b", fail_on=3)},
                   per_column=10, block=5, concurrency=2, warmup=2)
    )  # fmt: skip
    assert len(records["a"].outcomes) == 10
    assert len(records["b"].outcomes) == 9
    assert records["b"].errors == ["RuntimeError: boom"]
    assert len(records["a"].block_rps) == len(records["b"].block_rps) == 2
    # Round 0 runs a then b; round 1 runs b then a.
    assert order == ["a"] * 5 + ["b"] * 5 + ["b"] * 5 + ["a"] * 5
