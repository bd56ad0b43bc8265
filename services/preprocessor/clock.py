"""Each agent session's client clock offset, estimated from its steps (a min filter).

A phone stamps `frame_ts` (capture) and the step's send time (`AgentStep.sent_at`, else
the envelope's `created_at`, which a client publishing on the bus stamps from its own
clock) on its own clock; the fleet judges staleness on its own. For every step,
`sample = received - sent`, with `received` the time INGRESS stored the step (the fleet's
clock), equals the offset (fleet minus client) plus the step's network transit, which is
never negative. So the smallest sample of a session's recent steps is its offset plus the
shortest transit seen, as NTP's clock filter keeps the sample with the least delay: the
estimate errs only by that transit (milliseconds), and only towards a younger frame (a
frame is passed that much too late, never dropped for the skew). The time a step then
waits in INGRESS, the preprocessor, the router and the worker all counts in its age,
because `received` is the store time, not when the preprocessor got to it.

Kept in memory per preprocessor replica, not in KV: a session's steps reach the replicas
in turn (one shared durable), so each replica's filter sees a subset of them and its
estimate is at most one transit further off than the fleet-wide one; a KV read and write
per step would put a round trip on every step's path to win those milliseconds back.

Only recent samples count (`window` steps within `horizon` seconds): a client clock that
NTP steps forward is followed at the next step (its samples drop), one stepped back by X
ages its frames by X until the older samples leave the window (8 steps, a few seconds at
an agent's step rate). An HTTP step without `sent_at` carries the edge's `created_at`,
so its offset comes out as about 0: a client that does not tell its clock is taken as
right, as before.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from switchyard.messages.inference import MAX_CLOCK_OFFSET

WINDOW = 8  # samples kept per session
HORIZON = 120.0  # seconds a sample counts for
MAX_SESSIONS = 100_000  # sessions remembered; the least recently seen are forgotten first


class ClockOffsets:
    """Per (tenant, session): the recent `(received, received - sent)` samples."""

    def __init__(
        self,
        window: int = WINDOW,
        horizon: float = HORIZON,
        max_sessions: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.window = window
        self.horizon = horizon
        self.max_sessions = max_sessions
        self.clock = clock
        # In the order last seen, so the stalest session is the first to forget.
        self._samples: dict[tuple[str, str], deque[tuple[float, float]]] = {}

    def observe(self, tenant: str, session: str | None, sent: float, received: float) -> float:
        """Record one step (its client-clock `sent`, fleet-clock `received`) and return the
        session's offset estimate (fleet minus client, seconds), clamped to
        +-`MAX_CLOCK_OFFSET`. A step without a session is its own estimate."""
        sample = received - sent
        if session is None:
            return _clamp(sample)
        key = (tenant, session)
        samples = self._samples.pop(key, None) or deque(maxlen=self.window)
        self._samples[key] = samples  # re-inserted at the end: the most recently seen
        samples.append((received, sample))
        while samples and received - samples[0][0] > self.horizon:
            samples.popleft()
        self._forget(self.clock())
        return _clamp(min(s for _, s in samples))  # the current sample is always in it

    def __len__(self) -> int:
        return len(self._samples)

    def _forget(self, now: float) -> None:
        while self._samples:
            key, samples = next(iter(self._samples.items()))
            idle = not samples or now - samples[-1][0] > self.horizon
            if not idle and len(self._samples) <= self.max_sessions:
                return
            del self._samples[key]


def _clamp(offset: float) -> float:
    return max(-MAX_CLOCK_OFFSET, min(MAX_CLOCK_OFFSET, offset))
