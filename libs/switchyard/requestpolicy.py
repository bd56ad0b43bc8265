"""Whether a request may still run: cancelled, stale or past its deadline.

The router asks before it dispatches and while a request waits in its queue; the
worker asks again before it starts the engine, because time passes between the
two. Both give the same verdict in the same order: a cancel first (the client is
gone), then a stale frame (the action would be useless: the phone should send a
fresh one), then the deadline.

A cancel can arrive before the request it names (it travels on core NATS, the
request through two streams), so each of them remembers recent cancels as
`Tombstones`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from switchyard.errors import ErrorCode
from switchyard.messages.inference import ErrorInfo, GenerateRequest, ResultStatus

# Longer than any request waits in a queue: an older cancel can name nothing still waiting.
TOMBSTONE_TTL = 600.0


@dataclass(frozen=True)
class Refusal:
    """Why a request is answered without running: its result status, code and reason."""

    status: ResultStatus
    code: ErrorCode
    reason: str
    retry_after: float | None = None

    @property
    def error(self) -> ErrorInfo:
        return ErrorInfo(code=self.code, reason=self.reason, retry_after=self.retry_after)


def verdict(
    req: GenerateRequest, now: float, *, cancelled: bool = False, where: str
) -> Refusal | None:
    """None if `req` may still run at `now`; else why not. `where` says at which step
    it is asked ("at dispatch", "while queued", ...) and ends up in the reason."""
    if cancelled:
        return Refusal("cancelled", "cancelled", f"cancelled {where}")
    age = req.frame_age(now)
    if req.stale_after is not None and age is not None and age > req.stale_after:
        reason = f"frame is {age:.3f}s old {where}, budget {req.stale_after:.3f}s"
        return Refusal("stale", "stale", reason)
    if req.deadline is not None and now > req.deadline:
        late = now - req.deadline
        return Refusal("expired", "expired", f"deadline passed {where} ({late:.3f}s late)")
    return None


class Tombstones:
    """Ids of requests cancelled in the last `ttl` seconds."""

    def __init__(self, ttl: float = TOMBSTONE_TTL, clock: Callable[[], float] = time.time) -> None:
        self.ttl = ttl
        self.clock = clock
        self._at: dict[str, float] = {}  # in the order added, so the oldest come first

    def add(self, request_id: str) -> None:
        now = self.clock()
        self._at.pop(request_id, None)  # a repeated cancel counts from now, at the end
        self._at[request_id] = now
        self._prune(now)

    def __contains__(self, request_id: object) -> bool:
        at = self._at.get(request_id) if isinstance(request_id, str) else None
        return at is not None and self.clock() - at <= self.ttl

    def __len__(self) -> int:
        return len(self._at)

    def _prune(self, now: float) -> None:
        while self._at:
            oldest, at = next(iter(self._at.items()))
            if now - at <= self.ttl:
                return  # the rest are younger
            del self._at[oldest]
