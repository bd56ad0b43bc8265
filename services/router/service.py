"""Wire the router to the bus: tenant policies from a file (or one permissive default),
and the lease that lets exactly one router of a group admit at a time (`leadership`)."""

from __future__ import annotations

import asyncio
import contextlib

from services.router.leadership import Lease
from services.router.router import Router
from services.router.settings import RouterSettings
from services.router.status import publish_status, resume_usage
from switchyard.bus.connection import Bus
from switchyard.logging import get_logger
from switchyard.scheduling.policy import Policies, TenantPolicy

log = get_logger(__name__)


def load_policies(settings: RouterSettings) -> Policies:
    if settings.tenant_policy is None:
        log.warning("router.no_tenant_policy", note="every tenant gets the default policy")
        return Policies(default=TenantPolicy())
    return Policies.load(settings.tenant_policy)


async def run_router(bus: Bus, stop: asyncio.Event, settings: RouterSettings) -> None:
    """Stand by until this router holds the lease, route while it does; a router that
    lost it (could not renew in time) starts over as a standby with empty state."""
    policies = load_policies(settings)
    lease = Lease(bus.js, settings.router_id, settings.pools)
    while await lease.acquire(stop):
        active = asyncio.Event()  # set: stop routing (asked to stop, or the lease is lost)
        holding = asyncio.create_task(_hold(lease, stop, active))
        try:
            await route(bus, active, settings, policies)
        finally:
            active.set()
            await holding
            await lease.release()


async def _hold(lease: Lease, stop: asyncio.Event, active: asyncio.Event) -> None:
    """Renew the lease until `stop` or `active` is set; losing it ends the routing."""
    either = asyncio.Event()

    async def relay(event: asyncio.Event) -> None:
        await event.wait()
        either.set()

    relays = [asyncio.create_task(relay(stop)), asyncio.create_task(relay(active))]
    try:
        await lease.hold(either)
    finally:
        active.set()
        for task in relays:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def route(
    bus: Bus, stop: asyncio.Event, settings: RouterSettings, policies: Policies
) -> None:
    router = Router(bus, settings, policies)
    await resume_usage(router)  # where the router before this one left each tenant
    # Per-tenant usage for the edge's console (KV `fleet_tenants`), beside the routing.
    status = asyncio.create_task(publish_status(router, stop))
    try:
        await router.run(stop)
    finally:
        status.cancel()
