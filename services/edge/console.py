"""The web console: two static pages served by the edge, and the two endpoints they add.

- `GET /console` (ask a question, watch its stages) and `GET /console/fleet` (workers
  and tenant usage), with their files under `/console/static/`: plain HTML, ES modules
  and CSS from `services/edge/static/console/`; nothing is built at run time.
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import nats.errors
import nats.js.errors
from fastapi import Depends, FastAPI, Header, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from services.edge.auth import KeyRing, Principal
from services.edge.errors import ApiError
from services.edge.settings import EdgeSettings
from services.router.status import BUCKET as TENANTS_BUCKET
from services.router.status import TenantStatus
from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.codec import decode
from switchyard.errors import DecodeError
from switchyard.logging import get_logger
from switchyard.messages.fleet import WorkerHeartbeat
from switchyard.messages.sql import AuditEvent, SqlText
from switchyard.sqlguard.signing import sql_hash

log = get_logger(__name__)
M = TypeVar("M", bound=BaseModel)

STATIC = Path(__file__).resolve().parent / "static" / "console"
WORKERS_BUCKET = "fleet_workers"
REVIEW_EVENT = "review.requested"
KV_READ_TIMEOUT = 2.0  # s: the page polls every second, a stuck read must not pile up

# The pages load only their own files and talk only to this origin.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


# The edge's error body (OpenAI's shape), for the statuses these endpoints answer.
_ERROR: dict[str, Any] = {
    "type": "object",
    "properties": {"error": {"type": "object", "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]},
        "request_id": {"type": ["string", "null"]},
    }, "required": ["message", "type"]}},
    "required": ["error"],
}  # fmt: skip
_DESCRIPTIONS = {
    400: "Body is not JSON", 401: "Missing or unknown API key",
    403: "Key may not use the sql pool", 413: "Body too large", 422: "Validation error",
    503: "Fleet state or the review queue unavailable",
}  # fmt: skip


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {
        c: {"description": _DESCRIPTIONS[c], "content": {"application/json": {"schema": _ERROR}}}
        for c in codes
    }


class WorkerRow(BaseModel):
    """A live worker as its last heartbeat describes it."""

    worker: str
    pool: str
    engine: str
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
        description="usage per (tenant, router): the key's tenant only, unless operator"
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


async def _principal(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    keys: KeyRing = request.app.state.keys
    return keys.authenticate(authorization)


Who = Annotated[Principal, Depends(_principal)]


def mount_console(app: FastAPI, settings: EdgeSettings, bus_of: Callable[[], Bus]) -> None:
    """Add the console's pages, static files and endpoints to the edge's `app`."""

    def page(name: str) -> FileResponse:
        return FileResponse(STATIC / name, media_type="text/html", headers=SECURITY_HEADERS)

    @app.get("/console", include_in_schema=False)
    async def ask_page() -> FileResponse:
        return page("index.html")

    @app.get("/console/fleet", include_in_schema=False)
    async def fleet_page() -> FileResponse:
        return page("fleet.html")

    app.mount("/console/static", StaticFiles(directory=STATIC), name="console-static")

    @app.get("/v1/fleet", response_model=FleetStatus, responses=_errors(401, 503),
             tags=["console"])  # fmt: skip
    async def fleet(who: Who) -> JSONResponse:
        """Live workers (of the pools the key may use) and tenant usage against quota."""
        bus = bus_of()
        now = time.time()
        workers = [
            row
            for row in await read_workers(bus, now)
            if who.operator or who.may_use_pool(row.pool)
        ]
        tenants = await read_tenants(bus, None if who.operator else who.tenant)
        body = FleetStatus(tenant=who.tenant, operator=who.operator, at=now, workers=workers,
                           tenants=tenants)  # fmt: skip
        return JSONResponse(body.model_dump(mode="json"), headers={"Cache-Control": "no-store"})

    @app.post(
        "/v1/sql/review", response_model=ReviewQueued, status_code=202, tags=["sql"],
        responses=_errors(400, 401, 403, 413, 422, 503),
    )  # fmt: skip
    async def request_review(body: ReviewBody, request: Request, who: Who) -> JSONResponse:
        """Queue a question and its SQL for review: an audit event `review.requested`
        on `audit.review.<tenant>`, listed by `sy sql review --requests`."""
        if not who.may_use_pool(settings.sql_pool):
            raise ApiError(403, "this key may not use the sql pool", "permission_error")
        rid = getattr(request.state, "request_id", None) or ""
        detail: dict[str, Any] = {"note": body.note, "answer_request_id": body.request_id}
        event = AuditEvent(
            tenant=who.tenant, request_id=rid, event=REVIEW_EVENT, actor="edge.console",
            verdict="requested", question=body.question, sql=body.sql,
            sql_hash=sql_hash(body.sql),
            detail={k: v for k, v in detail.items() if v is not None},
        )  # fmt: skip
        try:
            await publish(bus_of().js, subjects.audit("review", who.tenant), event, timeout=5.0)
        except Exception as exc:
            log.warning("edge.review_failed", error=repr(exc)[:200])
            raise ApiError(503, "the review request could not be stored",
                           "service_unavailable_error", "no_capacity") from None  # fmt: skip
        return JSONResponse(ReviewQueued(review_id=rid).model_dump(), 202)


async def read_workers(bus: Bus, now: float) -> list[WorkerRow]:
    """Every worker with a heartbeat in KV (the bucket's TTL drops the dead ones)."""
    rows = []
    for beat in await _read_bucket(bus, WORKERS_BUCKET, ">", WorkerHeartbeat):
        rows.append(
            WorkerRow(
                worker=beat.worker, pool=beat.pool, engine=beat.engine,
                age=round(max(0.0, now - beat.at), 3), partitions=sorted(beat.partitions),
                slots=beat.slots, running=beat.running, waiting=beat.waiting,
                queued=beat.queued, kv_cache_usage=beat.kv_cache_usage,
                prefix_hit_rate=beat.prefix_hit_rate, draining=beat.draining,
            )
        )  # fmt: skip
    return sorted(rows, key=lambda r: (r.pool, r.worker))


async def read_tenants(bus: Bus, tenant: str | None) -> list[TenantStatus]:
    """Tenant rows: only `<tenant>.*` keys when `tenant` is given (every row else)."""
    rows = await _read_bucket(bus, TENANTS_BUCKET, f"{tenant}.*" if tenant else ">", TenantStatus)
    # The key filter already did it; a value naming another tenant would be a bug upstream.
    rows = [r for r in rows if tenant is None or r.tenant == tenant]
    return sorted(rows, key=lambda r: (r.tenant, r.router))


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
        raise ApiError(503, f"fleet state ({bucket}) could not be read in time",
                       "service_unavailable_error", "no_capacity") from None  # fmt: skip
    out: list[M] = []
    for subject, msg in zip(found, stored, strict=True):
        if isinstance(msg, nats.js.errors.NotFoundError):
            continue  # expired or purged between the listing and the read
        if isinstance(msg, BaseException):
            raise ApiError(503, f"fleet state ({bucket}) could not be read",
                           "service_unavailable_error", "no_capacity") from msg  # fmt: skip
        if not msg.data or (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
            continue
        try:
            out.append(decode(msg.data, model))
        except DecodeError as exc:
            log.warning("edge.console.bad_value", bucket=bucket, key=subject[len(prefix):],
                        error=exc.reason[:200])  # fmt: skip
    return out
