"""Each request's share of the engine's time: what a bill counts as its GPU-seconds.

The engine's time is split equally among the requests it holds at each moment (handed
to it and not finished): a request alone on the GPU for 2 s is charged 2 s, each of four
batched together for those 2 s 0.5 s. So the charges of every request add up to the
time the engine held any work, and a tenant pays for the GPU time it shared, not for
its wall time (which, batched, counts the same second once per request). Equal shares
do not weigh a long prefill against a decode token; a request waiting in the engine's
own queue for a slot counts as held (the worker cannot see vLLM's queue per request).

The share is kept as one integral, I(t) = the integral of dt / held(t): a request's
share over [a, b] is I(b) - I(a), in O(1) per event whatever the batch size.
"""

from __future__ import annotations


class EngineTime:
    def __init__(self) -> None:
        self._held = 0
        self._since = 0.0
        self._integral = 0.0

    def _advance(self, now: float) -> float:
        if self._held:
            self._integral += max(0.0, now - self._since) / self._held
        self._since = max(self._since, now)
        return self._integral

    def start(self, now: float) -> float:
        """A request was handed to the engine at `now`: the mark its share counts from."""
        mark = self._advance(now)
        self._held += 1
        return mark

    def mark(self, now: float) -> float:
        """The integral at `now` (a request's first token: where prefill becomes decode)."""
        return self._advance(now)

    def finish(self, now: float) -> float:
        """A request left the engine at `now`: the mark its share counts to."""
        mark = self._advance(now)
        self._held = max(0, self._held - 1)
        return mark
