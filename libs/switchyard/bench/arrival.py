"""When a load test's requests are due: open-loop schedules and the closed-loop model.

Open loop (the right model for capacity): requests are due at times drawn in
advance, independent of how fast the fleet answers, so a slow fleet builds a
backlog that shows in the latency (measured from each request's due time, see
`loadgen`). Closed loop (N users, each sends when its previous answer arrived)
slows its own arrivals when the fleet slows, which hides queueing; it is here
for single-user latency and for comparison, and says so in its report.

Every schedule is a pure function of its arguments and a seed: the same seed
gives the same due times, so two runs (or two fleets) see the same arrivals.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

ArrivalKind = Literal["poisson", "constant", "bursty", "closed"]
OPEN_KINDS: tuple[ArrivalKind, ...] = ("poisson", "constant", "bursty")


class ArrivalError(ValueError):
    """An arrival process that cannot be built (bad rate, burst or kind)."""


@dataclass(frozen=True)
class Arrival:
    """How requests arrive. `rate` (req/s) for open kinds, `concurrency` (users) for closed.

    bursty: bursts of `burst` requests arrive as a Poisson process at `rate / burst`
    bursts per second, the requests of a burst `burst_spread_s` apart - the same mean
    rate as `poisson`, with far more variance (a wave of phones waking up together).
    """

    kind: ArrivalKind = "poisson"
    rate: float = 1.0
    concurrency: int = 1
    burst: int = 8
    burst_spread_s: float = 0.001
    think_s: float = 0.0  # closed loop: a user's pause between an answer and its next request

    def __post_init__(self) -> None:
        if self.kind not in (*OPEN_KINDS, "closed"):
            raise ArrivalError(f"unknown arrival kind {self.kind!r}")
        if self.kind == "closed":
            if self.concurrency < 1:
                raise ArrivalError(f"closed loop needs at least one user, got {self.concurrency}")
        elif not (math.isfinite(self.rate) and self.rate > 0):
            raise ArrivalError(f"open-loop rate must be a positive number, got {self.rate}")
        if self.burst < 1 or self.burst_spread_s < 0 or self.think_s < 0:
            raise ArrivalError("burst must be >= 1, burst spread and think time >= 0")

    @property
    def open(self) -> bool:
        return self.kind != "closed"

    @property
    def load(self) -> float:
        """The offered load on a sweep's x axis: req/s (open) or users (closed)."""
        return self.rate if self.open else float(self.concurrency)

    def label(self) -> str:
        if self.open:
            return f"{self.kind} {self.rate:g} req/s"
        return f"closed loop, {self.concurrency} users"


def schedule(arrival: Arrival, duration_s: float, seed: int) -> list[float]:
    """Due times (seconds from the run's start, ascending) of an open-loop run.

    Raises `ArrivalError` for a closed loop, which has no schedule: its users send
    when their previous answer arrives.
    """
    if not arrival.open:
        raise ArrivalError("a closed loop has no schedule; its users pace themselves")
    if duration_s <= 0:
        raise ArrivalError(f"duration must be positive, got {duration_s}")
    rng = random.Random(seed)
    times: list[float] = []
    if arrival.kind == "constant":
        n = math.floor(duration_s * arrival.rate - 1e-9) + 1
        return [i / arrival.rate for i in range(n) if i / arrival.rate < duration_s]
    if arrival.kind == "poisson":
        t = rng.expovariate(arrival.rate)
        while t < duration_s:
            times.append(t)
            t += rng.expovariate(arrival.rate)
        return times
    # bursty
    t = rng.expovariate(arrival.rate / arrival.burst)
    while t < duration_s:
        times.extend(
            t + k * arrival.burst_spread_s
            for k in range(arrival.burst)
            if t + k * arrival.burst_spread_s < duration_s
        )
        t += rng.expovariate(arrival.rate / arrival.burst)
    return times
