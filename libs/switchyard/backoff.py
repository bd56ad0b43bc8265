"""How long to wait before trying again: exponential backoff with jitter, for every retry
loop of the fleet (a publish during a failover, a message handed back to its stream, a
batch the database refused, a pull the server turned down).

Why jitter: a failover hits every process at once (every worker's pullers hear the same
leadership change, every service's publishes time out on the same dead leader). Without
jitter they all retry on the same schedule and arrive together at the new leader, again
and again. "Equal jitter" (half the ceiling fixed, half drawn uniformly) spreads them
while keeping a floor, so no retry comes back at once and hammers what just failed:
see "Exponential Backoff And Jitter" (AWS Architecture Blog, 2015), where equal and full
jitter both cut the retries' total work against none.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Waits that double from `first` up to `cap`, each drawn from [ceiling/2, ceiling]."""

    first: float  # s: the ceiling of the wait after the first failure
    cap: float  # s: no wait is longer
    rng: random.Random | None = None  # a seeded one for tests; the module's otherwise

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.cap:
            raise ValueError(f"backoff needs 0 < first <= cap, got {self.first}, {self.cap}")

    def ceiling(self, attempt: int) -> float:
        """The longest wait after failure number `attempt + 1` (0: the first failure)."""
        return min(self.cap, self.first * 2.0 ** min(max(0, attempt), 60))

    def delay(self, attempt: int) -> float:
        """The wait after failure number `attempt + 1`, jittered."""
        ceiling = self.ceiling(attempt)
        draw = (self.rng or random).random()
        return ceiling / 2 + draw * ceiling / 2
