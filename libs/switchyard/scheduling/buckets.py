"""Token buckets that count tokens, not requests: one request can cost 10^5 times another."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    """`capacity` tokens, refilled continuously at `capacity` per `period` seconds."""

    capacity: float
    period: float = 60.0
    level: float = -1.0  # set to capacity on first use
    updated: float = 0.0

    @property
    def rate(self) -> float:
        return self.capacity / self.period

    def _refill(self, now: float) -> None:
        if self.level < 0:
            self.level, self.updated = self.capacity, now
            return
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    def wait_for(self, tokens: float, now: float) -> float:
        """Seconds until `tokens` fit (0 = now); `inf` if they never can."""
        self._refill(now)
        if tokens > self.capacity:
            return float("inf")
        return max(0.0, (tokens - self.level) / self.rate)

    def take(self, tokens: float, now: float) -> None:
        self._refill(now)
        self.level -= tokens

    def give_back(self, tokens: float, now: float) -> None:
        self._refill(now)
        self.level = min(self.capacity, self.level + tokens)
