"""Wire the router to the bus: tenant policies from a file (or one permissive default)."""

from __future__ import annotations

import asyncio

from services.router.router import Router
from services.router.settings import RouterSettings
from services.router.status import publish_status
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
    router = Router(bus, settings, load_policies(settings))
    # Per-tenant usage for the edge's console (KV `fleet_tenants`), beside the routing.
    status = asyncio.create_task(publish_status(router, stop))
    try:
        await router.run(stop)
    finally:
        status.cancel()
