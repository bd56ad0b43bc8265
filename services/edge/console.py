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

import asyncio
from typing import Annotated, TypeVar

import nats.errors
import nats.js.errors
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from services.edge.errors import Unavailable
from switchyard.bus.connection import Bus
from switchyard.bus.topology import TENANTS_BUCKET, WORKERS_BUCKET
from switchyard.codec import decode
from switchyard.errors import DecodeError
from switchyard.logging import get_logger
from switchyard.messages.fleet import TenantStatus, WorkerHeartbeat, WorkerRole
from switchyard.messages.sql import SqlText

log = get_logger(__name__)
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
    """The latest value of every key matching `keys` (a subject filter, applied by the
    server); an undecodable value is logged and skipped, a missing bucket is no rows.

    The server lists the matching keys (stream info with a subject filter), then each
    key's last message is fetched. Not `KeyValue.watch`: nats-py can hand out its
    "no more values" marker before a value that is already on its way, which would
    show a live fleet as empty."""
    stream, prefix = f"KV_{bucket}", f"$KV.{bucket}."
    try:
        async with asyncio.timeout(KV_READ_TIMEOUT):
            try:
                info = await bus.js.stream_info(stream, subjects_filter=prefix + keys)
            except nats.js.errors.NotFoundError:
                log.warning("edge.console.no_bucket", bucket=bucket)
                return []
            found = sorted((info.state.subjects or {}).keys())
            stored = await asyncio.gather(
                *(bus.js.get_last_msg(stream, subject) for subject in found),
                return_exceptions=True,
            )
    except (TimeoutError, nats.errors.TimeoutError):
        # Half a list would read as "these are all the workers": say it failed instead.
        raise Unavailable(f"fleet state ({bucket}) could not be read in time") from None
    out: list[M] = []
    for subject, msg in zip(found, stored, strict=True):
        if isinstance(msg, nats.js.errors.NotFoundError):
            continue  # expired or purged between the listing and the read
        if isinstance(msg, BaseException):
            raise Unavailable(f"fleet state ({bucket}) could not be read") from msg
        if not msg.data or (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
            continue
        try:
            out.append(decode(msg.data, model))
        except DecodeError as exc:
            log.warning("edge.console.bad_value", bucket=bucket, key=subject[len(prefix):],
                        error=exc.reason[:200])  # fmt: skip
    return out
