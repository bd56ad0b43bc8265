"""Whether a request may still run: cancelled, superseded, stale or past its deadline.

The router asks before it dispatches and while a request waits in its queue; the
worker asks again before it starts the engine, because time passes between the
two. Both give the same verdict in the same order: a cancel first (the client is
gone), then a newer step of the same agent session (this step's screen is already
out of date and the client waits for the newer answer), then a stale frame (the action
would be useless: the phone should send a fresh one), then the deadline. When the
engine has finished, the worker asks `staleness` once more: an answer that came too late
for its frame is answered `stale`, not as an action. Before all of them the preprocessor
asks `stale_frame` of a step, before it prepares its frames: one rule, one reason.

A cancel can arrive before the request it names (it travels on core NATS, the
request through two streams), so each of them remembers recent cancels as
`Tombstones`. Superseding needs no request id: the router that admits step n of a
session tells every router and worker "(tenant, session) is at step n" (a `NewestStep`
on core NATS, `supersede.<tenant>`), and each keeps the newest step per session as
`NewestSteps`. A session's steps reach several routers (REQ is one shared work queue)
but its worker is one, so a notice per admitted step is what lets a router's newer step
supersede an older one that another router holds or has dispatched. It costs one small
message per step fanned out to the routers and workers; a KV bucket would cost a write per
step and a read (or a watch, the same fan-out) per start, for the same information. A lost
notice (core NATS is at most once) only lets an old step run and be answered as usual.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from switchyard.errors import ErrorCode
from switchyard.messages.inference import ErrorInfo, GenerateRequest, ResultStatus

# Longer than any request waits in a queue: an older cancel can name nothing still waiting.
TOMBSTONE_TTL = 600.0
# A session's newest step is forgotten this long after it last rose: longer than an agent
# step waits anywhere (its stale budget is seconds), short enough that a client that starts
# counting its steps again from 0 in the same session is superseded for a minute at most.
NEWEST_TTL = 60.0


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


def superseded_by(req: GenerateRequest, newest: int | None, where: str) -> Refusal:
    """`req`, a step of an agent session, gives way to the session's step `newest`."""
    reason = f"step {req.step} superseded by step {newest} of its session {where}"
    return Refusal("superseded", "superseded", reason)


def verdict(
    req: GenerateRequest,
    now: float,
    *,
    cancelled: bool = False,
    newest: int | None = None,
    where: str,
) -> Refusal | None:
    """None if `req` may still run at `now`; else why not. `newest` is the newest step seen
    of `req`'s session (`NewestSteps.newest`). `where` says at which step it is asked ("at
    dispatch", "while queued", ...) and ends up in the reason."""
    if cancelled:
        return Refusal("cancelled", "cancelled", f"cancelled {where}")
    if req.step is not None and newest is not None and newest > req.step:
        return superseded_by(req, newest, where)
    stale = staleness(req, now, where=where)
    if stale is not None:
        return stale
    if req.deadline is not None and now > req.deadline:
        late = now - req.deadline
        return Refusal("expired", "expired", f"deadline passed {where} ({late:.3f}s late)")
    return None


def staleness(req: GenerateRequest, now: float, *, where: str) -> Refusal | None:
    """`stale` if `req`'s frame is older than its budget at `now` (both on the fleet's
    clock: `frame_age` applies the session's client clock offset), else None."""
    return stale_frame(req.frame_age(now), req.stale_after, where=where)


def stale_frame(age: float | None, budget: float | None, *, where: str) -> Refusal | None:
    """`stale` if a frame `age` seconds old (on the fleet's clock) is over its `budget`;
    the preprocessor asks this of a step before it becomes a request."""
    if budget is not None and age is not None and age > budget:
        return Refusal("stale", "stale", f"frame is {age:.3f}s old {where}, budget {budget:.3f}s")
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


class NewestSteps:
    """The newest step number seen per agent session (tenant, session), for `verdict`.

    An entry lives `ttl` seconds after its step last rose, in the order they rose, so
    pruning looks at the oldest only (as `Tombstones` do).
    """

    def __init__(self, ttl: float = NEWEST_TTL, clock: Callable[[], float] = time.time) -> None:
        self.ttl = ttl
        self.clock = clock
        self._newest: dict[tuple[str, str], tuple[int, float]] = {}  # -> (step, when it rose)

    def see(self, tenant: str, session: str, step: int) -> bool:
        """Record that `step` of the session exists; True if it is newer than any seen (so
        it supersedes older steps and is worth telling the others about)."""
        now = self.clock()
        self._prune(now)
        key = (tenant, session)
        known = self._newest.get(key)
        if known is not None and known[0] >= step:
            return False
        self._newest.pop(key, None)  # re-inserted at the end: the order they rose in
        self._newest[key] = (step, now)
        return True

    def see_request(self, req: GenerateRequest) -> bool:
        """`see` for an agent step's request; False for a request that is not one."""
        if req.session is None or req.step is None:
            return False
        return self.see(req.tenant, req.session, req.step)

    def newest(self, req: GenerateRequest) -> int | None:
        """The newest step seen of `req`'s session, if it has one and it is remembered."""
        if req.session is None or req.step is None:
            return None
        known = self._newest.get((req.tenant, req.session))
        if known is None or self.clock() - known[1] > self.ttl:
            return None
        return known[0]

    def __len__(self) -> int:
        return len(self._newest)

    def _prune(self, now: float) -> None:
        while self._newest:
            oldest, (_, at) = next(iter(self._newest.items()))
            if now - at <= self.ttl:
                return
            del self._newest[oldest]
