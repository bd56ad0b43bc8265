"""Per-tenant admission: token buckets for input and output tokens, a concurrency
cap and a cap on queued tokens.

Output tokens are reserved at `max_tokens` on admission and the unused part is
refunded on completion, so a tenant cannot overrun OTPM by asking for long
outputs it has not paid for yet. A refusal carries `retry_after`: the time after
which the same request would be admitted if nothing else changed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from switchyard.errors import ErrorCode
from switchyard.scheduling.buckets import TokenBucket
from switchyard.scheduling.policy import Policies, TenantPolicy

# Concurrency and queue caps free up when something finishes; we cannot know
# when, so we suggest a short retry.
CAP_RETRY_AFTER = 1.0


@dataclass(frozen=True)
class Verdict:
    """Admitted (no `code`) at a clamped `priority`, or refused with a code and reason."""

    code: ErrorCode | None = None
    reason: str = ""
    retry_after: float | None = None
    priority: int = 0

    @property
    def ok(self) -> bool:
        return self.code is None


@dataclass(frozen=True)
class TenantUsage:
    """One tenant's standing at one moment: its policy and what of it is spent."""

    tenant: str
    policy: TenantPolicy
    # The buckets' capacity minus their level: output tokens count `max_tokens`
    # reserved until the request finishes.
    input_used: float
    output_used: float
    inflight: int
    queued_tokens: int


@dataclass
class _Reservation:
    tenant: str
    prompt_tokens: int
    max_tokens: int
    priority: int
    queued: bool = True


@dataclass
class _TenantState:
    policy: TenantPolicy
    itpm: TokenBucket
    otpm: TokenBucket
    inflight: int = 0
    queued_tokens: int = 0


@dataclass
class Admission:
    policies: Policies
    clock: Callable[[], float]
    _tenants: dict[str, _TenantState] = field(default_factory=dict)
    _reserved: dict[str, _Reservation] = field(default_factory=dict)

    def _state(self, tenant: str) -> _TenantState | None:
        state = self._tenants.get(tenant)
        if state is None:
            policy = self.policies.for_tenant(tenant)
            if policy is None:
                return None
            state = _TenantState(policy, TokenBucket(policy.itpm), TokenBucket(policy.otpm))
            self._tenants[tenant] = state
        return state

    def resume(self, tenant: str, input_used: float, output_used: float, at: float) -> None:
        """Start `tenant`'s buckets where another router left them at `at` (a router taking
        over must not hand every tenant a fresh minute's worth). What was in flight there
        stays spent: its refunds went to that router."""
        state = self._state(tenant)
        if state is None:
            return
        for bucket, used in ((state.itpm, input_used), (state.otpm, output_used)):
            bucket.level = max(0.0, bucket.capacity - used)
            bucket.updated = min(at, self.clock())

    def policy(self, tenant: str) -> TenantPolicy | None:
        state = self._state(tenant)
        return state.policy if state else None

    def admit(
        self, tenant: str, request_id: str, prompt_tokens: int, max_tokens: int, priority: int
    ) -> Verdict:
        held = self._reserved.get(request_id)
        if held is not None:  # a redelivered request keeps its reservation (and its clamp)
            return Verdict(priority=held.priority)
        state = self._state(tenant)
        if state is None:
            return Verdict("unknown_tenant", f"tenant {tenant!r} has no policy")
        p, now = state.policy, self.clock()
        low, high = p.priority
        priority = min(max(priority, low), high)
        cost = prompt_tokens + max_tokens
        if prompt_tokens > p.itpm or max_tokens > p.otpm or cost > p.max_queued_tokens:
            return Verdict(
                "invalid_request",
                f"request needs {prompt_tokens} input + {max_tokens} output tokens; the tenant's "
                f"limits are {p.itpm} input/min, {p.otpm} output/min, {p.max_queued_tokens} queued",
            )
        if state.inflight >= p.max_concurrency:
            reason = f"{state.inflight} requests in flight (cap {p.max_concurrency})"
            return Verdict("over_quota", reason, CAP_RETRY_AFTER)
        if state.queued_tokens + cost > p.max_queued_tokens:
            return Verdict(
                "over_quota",
                f"{state.queued_tokens} tokens already queued (cap {p.max_queued_tokens})",
                CAP_RETRY_AFTER,
            )  # fmt: skip
        wait_in = state.itpm.wait_for(prompt_tokens, now)
        wait_out = state.otpm.wait_for(max_tokens, now)
        if wait_in > 0 or wait_out > 0:
            which = "input" if wait_in >= wait_out else "output"
            wait = max(wait_in, wait_out)
            return Verdict(
                "over_quota", f"{which} tokens per minute exhausted",
                math.ceil(wait * 100) / 100,
            )  # fmt: skip
        state.itpm.take(prompt_tokens, now)
        state.otpm.take(max_tokens, now)
        state.inflight += 1
        state.queued_tokens += cost
        self._reserved[request_id] = _Reservation(tenant, prompt_tokens, max_tokens, priority)
        return Verdict(priority=priority)

    def dispatched(self, request_id: str) -> None:
        r = self._reserved.get(request_id)
        if r is None or not r.queued:
            return
        r.queued = False
        state = self._tenants[r.tenant]
        state.queued_tokens -= r.prompt_tokens + r.max_tokens

    def finished(self, request_id: str, completion_tokens: int | None) -> None:
        """The request ended. `completion_tokens=None`: it never ran, refund everything."""
        r = self._reserved.pop(request_id, None)
        if r is None:
            return
        state, now = self._tenants[r.tenant], self.clock()
        if r.queued:
            state.queued_tokens -= r.prompt_tokens + r.max_tokens
        state.inflight -= 1
        if completion_tokens is None:
            state.itpm.give_back(r.prompt_tokens, now)
            state.otpm.give_back(r.max_tokens, now)
        else:
            state.otpm.give_back(max(0, r.max_tokens - completion_tokens), now)

    def usage(self, now: float) -> list[TenantUsage]:
        """Every tenant seen so far, its buckets refilled to `now`."""
        out = []
        for tenant, state in self._tenants.items():
            # wait_for(0) refills the bucket to `now` without taking anything.
            state.itpm.wait_for(0, now)
            state.otpm.wait_for(0, now)
            out.append(
                TenantUsage(
                    tenant, state.policy,
                    input_used=max(0.0, state.itpm.capacity - state.itpm.level),
                    output_used=max(0.0, state.otpm.capacity - state.otpm.level),
                    inflight=state.inflight, queued_tokens=max(0, state.queued_tokens),
                )
            )  # fmt: skip
        return out

    def inflight(self, tenant: str) -> int:
        state = self._tenants.get(tenant)
        return state.inflight if state else 0

    def holds(self, request_id: str) -> bool:
        return request_id in self._reserved
