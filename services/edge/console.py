"""The web console's data: the fleet's state as the pages show it, and a review request.

The console (routes in `services.edge.routes.console`) is two static pages served by
the edge, `/console` (ask a question, watch its stages) and `/console/fleet` (workers
and tenant usage), with their files under `/console/static/`: plain HTML, ES modules and
CSS from `services/edge/static/console/`; nothing is built at run time. They add two
endpoints:

- `GET /v1/fleet`: the live workers (KV `fleet_workers`) and the caller's tenant's
  usage against its quota (KV `fleet_tenants`, written by every router). A tenant key
  reads only the keys `<its tenant>.*`, so another tenant's row never reaches the edge
  for it, let alone the page; an `operator: true` key reads every tenant's.
- `POST /v1/sql/review`: a question and its SQL into the review queue, which is an
  audit event `review.requested` on `audit.review.<tenant>` (stream AUDIT, kept by
  the auditor); `sy sql review --requests` lists them.

The pages keep the API key in `sessionStorage` and send it as a Bearer header: they
are public files, every byte of data comes through the authenticated API.
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from services.edge.errors import Unavailable
from switchyard.bus.connection import Bus
from switchyard.bus.kvread import KvUnreadable, latest_values
from switchyard.bus.topology import TENANTS_BUCKET, WORKERS_BUCKET
from switchyard.messages.fleet import TenantStatus, WorkerHeartbeat, WorkerRole
from switchyard.messages.sql import SqlText

M = TypeVar("M", bound=BaseModel)

KV_READ_TIMEOUT = 2.0  # s: the page polls every second, a stuck read must not pile up


class WorkerRow(BaseModel):
    """A live worker as its last heartbeat describes it."""

    worker: str
    pool: str
    engine: str
    role: WorkerRole = Field(description="both, or one stage of a disaggregated pool")
    age: float = Field(description="seconds since its last heartbeat")
    partitions: list[int]
    slots: int
    running: int
    waiting: int
    queued: int
    kv_cache_usage: float
    prefix_hit_rate: float
    draining: bool


class FleetStatus(BaseModel):
    tenant: str = Field(description="the key's tenant")
    operator: bool
    at: float
    workers: list[WorkerRow]
    tenants: list[TenantStatus] = Field(
        description="usage per tenant, from the router admitting it: the key's tenant only, "
        "unless operator"
    )


class ReviewBody(BaseModel):
    """A question and the SQL that answered it, for a human to check (and verify)."""

    model_config = ConfigDict(extra="forbid")

    question: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    sql: SqlText
    request_id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")] | None = Field(
        default=None, description="the answer's request id, if it came from one"
    )
    note: Annotated[str, StringConstraints(max_length=1000)] | None = None


class ReviewQueued(BaseModel):
    review_id: str
    status: str = "queued"


async def read_workers(bus: Bus, now: float) -> list[WorkerRow]:
    """Every worker with a heartbeat in KV (the bucket's TTL drops the dead ones)."""
    rows = []
    for beat in await _read_bucket(bus, WORKERS_BUCKET, ">", WorkerHeartbeat):
        rows.append(
            WorkerRow(
                worker=beat.worker, pool=beat.pool, engine=beat.engine, role=beat.role,
                age=round(max(0.0, now - beat.at), 3), partitions=sorted(beat.partitions),
                slots=beat.slots, running=beat.running, waiting=beat.waiting,
                queued=beat.queued, kv_cache_usage=beat.kv_cache_usage,
                prefix_hit_rate=beat.prefix_hit_rate, draining=beat.draining,
            )
        )  # fmt: skip
    return sorted(rows, key=lambda r: (r.pool, r.worker))


async def read_tenants(bus: Bus, tenant: str | None) -> list[TenantStatus]:
    """Tenant rows: only `<tenant>.*` keys when `tenant` is given (every tenant else), the
    newest per tenant: one router admits at a time (services/router/leadership.py), so a
    row of a router that lost or handed over the lease is history until its TTL ends."""
    rows = await _read_bucket(bus, TENANTS_BUCKET, f"{tenant}.*" if tenant else ">", TenantStatus)
    # The key filter already did it; a value naming another tenant would be a bug upstream.
    newest: dict[str, TenantStatus] = {}
    for row in rows:
        if (tenant is None or row.tenant == tenant) and (
            row.tenant not in newest or row.at > newest[row.tenant].at
        ):
            newest[row.tenant] = row
    return sorted(newest.values(), key=lambda r: r.tenant)


async def _read_bucket(bus: Bus, bucket: str, keys: str, model: type[M]) -> list[M]:
    """`bus.kvread.latest_values`, its failure the edge's typed 503."""
    try:
        return await latest_values(bus.js, bucket, keys, model, KV_READ_TIMEOUT)
    except KvUnreadable as exc:
        raise Unavailable(str(exc)) from exc.__cause__
