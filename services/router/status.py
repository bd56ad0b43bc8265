"""Each tenant's standing at this router, published every second for the edge's console.

Token buckets, in-flight counts and the fair queue live only inside the router
process. Once a second the router writes, per tenant it has seen, a small
`TenantStatus` into KV `fleet_tenants` under `<tenant>.<router id>`: the key starts
with the tenant so the edge can read one tenant's rows by key filter alone, and
the router id keeps several routers from overwriting each other. The bucket's TTL
removes the rows of a router that stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from pydantic import Field

from switchyard.codec import encode
from switchyard.envelope import Model, TenantId, Token, UnixTime
from switchyard.logging import get_logger

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

    from services.router.router import Router

log = get_logger(__name__)

BUCKET = "fleet_tenants"
INTERVAL = 1.0  # s between two publications


class TenantStatus(Model):
    """KV `fleet_tenants` value (key `<tenant>.<router>`): one tenant at one router."""

    v: int = 1
    tenant: TenantId
    router: Token
    at: UnixTime
    # Quota (per minute) and what of it is spent now: the bucket's capacity minus its
    # level. Output tokens count `max_tokens` reserved until the request finishes.
    itpm: int = Field(ge=1)
    otpm: int = Field(ge=1)
    input_used: float = Field(ge=0)
    output_used: float = Field(ge=0)
    inflight: int = Field(ge=0)
    max_concurrency: int = Field(ge=1)
    queued: int = Field(ge=0)
    queued_tokens: int = Field(ge=0)
    max_queued_tokens: int = Field(ge=1)
    # How long the oldest of its queued requests has waited (0 when none waits).
    oldest_wait: float = Field(ge=0)
    vtc: float  # its virtual token counter in the fair queue


def key(tenant: str, router: str) -> str:
    return f"{tenant}.{router}"


def snapshot(router: Router, now: float) -> list[TenantStatus]:
    """Every tenant the router's admission has seen, as it stands at `now`."""
    oldest: dict[str, float] = {}
    for item in router.queue.items():
        oldest[item.tenant] = min(oldest.get(item.tenant, now), item.enqueued_at)
    out = []
    # Admission keeps its per-tenant state private; reading it here keeps the
    # scheduling code free of console concerns.
    for tenant, state in list(router.admission._tenants.items()):
        p = state.policy
        # wait_for(0) refills the bucket to `now` without taking anything.
        state.itpm.wait_for(0, now)
        state.otpm.wait_for(0, now)
        out.append(
            TenantStatus(
                tenant=tenant, router=router.s.router_id, at=now,
                itpm=p.itpm, otpm=p.otpm,
                input_used=max(0.0, state.itpm.capacity - state.itpm.level),
                output_used=max(0.0, state.otpm.capacity - state.otpm.level),
                inflight=state.inflight, max_concurrency=p.max_concurrency,
                queued=router.queue.depth(tenant), queued_tokens=max(0, state.queued_tokens),
                max_queued_tokens=p.max_queued_tokens,
                oldest_wait=max(0.0, now - oldest.get(tenant, now)),
                vtc=router.queue.counters.get(tenant, 0.0),
            )
        )  # fmt: skip
    return out


async def publish_status(router: Router, stop: asyncio.Event, interval: float = INTERVAL) -> None:
    """Write every tenant's status each `interval` until `stop`; a missing bucket (not
    provisioned yet) or a failed write is logged and retried, never fatal to routing."""
    kv: KeyValue | None = None
    while not stop.is_set():
        try:
            if kv is None:
                kv = await router.bus.js.key_value(BUCKET)
            for status in snapshot(router, time.time()):
                await kv.put(key(status.tenant, status.router), encode(status))
        except Exception as exc:
            kv = None
            log.warning("router.status_failed", error=repr(exc)[:200])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
