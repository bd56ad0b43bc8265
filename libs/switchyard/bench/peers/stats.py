"""The harness's statistics, as pure functions over what a run recorded.

- Prometheus text -> counter and gauge values summed over label sets (`parse_metrics`);
- counter deltas between two scrapes (a backend's counters are cumulative);
- prefix-cache hit rate = delta hits / delta queries over all backends (token-weighted,
  as vLLM defines it), never a mean of per-backend rates;
- load imbalance = max / mean of per-backend load (1.0 = perfectly even);
- latency summaries with the nearest-rank percentiles every `sy bench` table uses.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from switchyard.bench.stats import percentile

Sample = dict[str, float]  # metric name (as exposed, e.g. `..._total`) -> value summed


class MetricsParseError(ValueError):
    """Text that is not Prometheus exposition (a line that is not a sample)."""


def parse_metrics(text: str) -> Sample:
    """Sum each sample over its label sets (`prometheus_client`'s parser of the text format)."""
    out: Sample = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    except ValueError as e:
        raise MetricsParseError(f"not Prometheus text: {e}") from e
    return out


def delta(before: Mapping[str, float], after: Mapping[str, float], name: str) -> float:
    """How much a counter grew; a reset (smaller value after) is an error, not a negative."""
    a, b = after.get(name, 0.0), before.get(name, 0.0)
    if a < b:
        raise ValueError(f"counter {name} went backwards ({b} -> {a}): the backend restarted")
    return a - b


QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"


def hit_rate(before: Sequence[Mapping[str, float]], after: Sequence[Mapping[str, float]]) -> float:
    """Token-weighted prefix-cache hit rate over all backends between two scrapes."""
    if len(before) != len(after):
        raise ValueError(f"{len(before)} scrapes before, {len(after)} after")
    queries = sum(delta(b, a, QUERIES) for b, a in zip(before, after, strict=True))
    hits = sum(delta(b, a, HITS) for b, a in zip(before, after, strict=True))
    return hits / queries if queries else 0.0


def imbalance(loads: Sequence[float]) -> float:
    """max / mean of per-backend load; 1.0 is perfectly even, 0 when nothing ran."""
    if not loads:
        return 0.0
    if any(x < 0 or math.isnan(x) for x in loads):
        raise ValueError(f"loads must be non-negative numbers, got {list(loads)}")
    mean = statistics.fmean(loads)
    return max(loads) / mean if mean else 0.0


@dataclass(frozen=True)
class Latency:
    """Milliseconds; `n` samples."""

    n: int
    p50_ms: float
    p99_ms: float
    mean_ms: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Latency:
        ms = [s * 1000 for s in seconds]
        return cls(
            n=len(ms),
            p50_ms=round(percentile(ms, 0.5), 3),
            p99_ms=round(percentile(ms, 0.99), 3),
            mean_ms=round(statistics.fmean(ms), 3) if ms else 0.0,
        )
