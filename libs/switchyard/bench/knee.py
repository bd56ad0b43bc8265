"""The knee of a load sweep, and the admission limit it recommends ([S4] §8.4).

Walking the sweep from the lightest load up, the knee is the first load whose step
from the previous one bought less than `min_gain` (5 %) more throughput while p99
latency grew by more than `P99_GROWTH` (50 %): from there on, more load buys
queueing, not work. The recommended admission limit is `SAFETY` (0.8) times the
knee's load, the margin the source recommends for an HPA or rate-limit threshold.

No knee (every step still scaled, or p99 never jumped) is an answer too: the fleet
was not saturated by the largest load tried, and the report says so instead of
inventing one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

MIN_GAIN = 0.05
P99_GROWTH = 0.5
SAFETY = 0.8


class KneeError(ValueError):
    """A sweep that cannot be read: unsorted, duplicate or non-finite loads."""


@dataclass(frozen=True)
class Point:
    load: float
    throughput: float
    p99: float


@dataclass(frozen=True)
class Knee:
    index: int  # into the sweep's points, sorted by load
    load: float
    previous_load: float
    throughput_gain: float  # relative, of the step into the knee
    p99_growth: float  # relative, of the step into the knee
    recommended_limit: float  # safety x load


def find_knee(points: Sequence[Point], *, min_gain: float = MIN_GAIN) -> Knee | None:
    """The knee of `points` (ascending load), or None if the sweep never saturated."""
    loads = [p.load for p in points]
    if any(not math.isfinite(x) for p in points for x in (p.load, p.throughput)):
        raise KneeError("sweep loads and throughputs must be finite")
    if any(b <= a for a, b in itertools.pairwise(loads)):
        raise KneeError(f"sweep loads must be strictly ascending, got {loads}")
    for i in range(1, len(points)):
        prev, cur = points[i - 1], points[i]
        if prev.throughput <= 0:
            continue  # nothing served at the lighter load: no gain to measure from it
        gain = (cur.throughput - prev.throughput) / prev.throughput
        # An infinite p99 (requests that never finished) is growth without bound.
        if prev.p99 > 0:
            growth = math.inf if math.isinf(cur.p99) else (cur.p99 - prev.p99) / prev.p99
        else:
            growth = math.inf if cur.p99 > 0 else 0.0
        if gain < min_gain and growth > P99_GROWTH:
            return Knee(
                index=i, load=cur.load, previous_load=prev.load,
                throughput_gain=round(gain, 4), p99_growth=round(growth, 4),
                recommended_limit=round(SAFETY * cur.load, 4),
            )  # fmt: skip
    return None
