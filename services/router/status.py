"""Each tenant's standing at this router, published every second for the edge's console.

Token buckets, in-flight counts and the fair queue live only inside the router
process. Once a second the router writes, per tenant it has seen, a small
`TenantStatus` into KV `fleet_tenants` under `<tenant>.<router id>`: the key starts
with the tenant so the edge can read one tenant's rows by key filter alone, and
the router id keeps several routers from overwriting each other. The bucket's TTL
removes the rows of a router that stopped.

The same rows let a router that takes the lease over (`leadership`) start each tenant's
buckets where the last one left them (`resume_usage`), at most a second stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from nats.js.errors import KeyNotFoundError

from switchyard.bus.kvkeys import kv_keys
from switchyard.bus.topology import TENANTS_BUCKET
from switchyard.codec import decode, encode
from switchyard.errors import DecodeError
from switchyard.logging import get_logger
from switchyard.messages.fleet import TenantStatus, tenant_status_key

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

    from services.router.router import Router

log = get_logger(__name__)

INTERVAL = 1.0  # s between two publications


def snapshot(router: Router, now: float) -> list[TenantStatus]:
    """Every tenant the router's admission has seen, as it stands at `now`."""
    oldest: dict[str, float] = {}
    for item in router.queue.items():
        oldest[item.tenant] = min(oldest.get(item.tenant, now), item.enqueued_at)
    return [
        TenantStatus(
            tenant=u.tenant, router=router.s.router_id, at=now,
            itpm=u.policy.itpm, otpm=u.policy.otpm,
            input_used=u.input_used, output_used=u.output_used,
            inflight=u.inflight, max_concurrency=u.policy.max_concurrency,
            queued=router.queue.depth(u.tenant), queued_tokens=u.queued_tokens,
            max_queued_tokens=u.policy.max_queued_tokens,
            oldest_wait=max(0.0, now - oldest.get(u.tenant, now)),
            vtc=router.queue.counters.get(u.tenant, 0.0),
        )
        for u in router.admission.usage(now)
    ]  # fmt: skip


async def resume_usage(router: Router) -> int:
    """Seed the router's token buckets from the newest row of each tenant in KV
    `fleet_tenants` (written by whichever router held the lease before); how many tenants
    were resumed. Best effort: without the rows, tenants start with full buckets."""
    newest: dict[str, TenantStatus] = {}
    try:
        kv = await router.bus.js.key_value(TENANTS_BUCKET)
        for key in await kv_keys(router.bus.js, TENANTS_BUCKET):
            with contextlib.suppress(KeyNotFoundError, DecodeError):
                entry = await kv.get(key)
                row = decode(entry.value or b"", TenantStatus)
                if row.tenant not in newest or row.at > newest[row.tenant].at:
                    newest[row.tenant] = row
    except Exception as exc:
        log.warning("router.resume_failed", error=repr(exc)[:200])
        return 0
    for row in newest.values():
        router.admission.resume(row.tenant, row.input_used, row.output_used, row.at)
    if newest:
        log.info("router.resumed_usage", tenants=len(newest))
    return len(newest)


async def publish_status(router: Router, stop: asyncio.Event, interval: float = INTERVAL) -> None:
    """Write every tenant's status each `interval` until `stop`; a missing bucket (not
    provisioned yet) or a failed write is logged and retried, never fatal to routing."""
    kv: KeyValue | None = None
    while not stop.is_set():
        try:
            if kv is None:
                kv = await router.bus.js.key_value(TENANTS_BUCKET)
            for status in snapshot(router, time.time()):
                await kv.put(tenant_status_key(status.tenant, status.router), encode(status))
        except Exception as exc:
            kv = None
            log.warning("router.status_failed", error=repr(exc)[:200])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
