"""The web console's routes: its two pages, their static files, `GET /v1/fleet` and
`POST /v1/sql/review` (what they show and store: `services.edge.console`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from services.edge.console import (
    FleetStatus,
    ReviewBody,
    ReviewQueued,
    read_tenants,
    read_workers,
)
from services.edge.errors import Forbidden, Unavailable, error_responses
from services.edge.state import State, Who, request_id
from switchyard import subjects
from switchyard.bus.publish import publish
from switchyard.logging import get_logger
from switchyard.messages.sql import AuditEvent
from switchyard.sqlguard.signing import sql_hash

log = get_logger(__name__)

STATIC = Path(__file__).resolve().parent.parent / "static" / "console"
REVIEW_EVENT = "review.requested"

# The pages load only their own files and talk only to this origin. (nosniff, no
# framing, no referrer and HSTS are on every response: `middleware.SecurityHeaders`.)
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "Cache-Control": "no-cache",
}

# The error statuses these endpoints answer, as their OpenAPI documents them.
_DESCRIPTIONS = {
    400: "Body is not JSON", 401: "Missing or unknown API key",
    403: "Key may not use the sql pool", 413: "Body too large", 422: "Validation error",
    503: "Fleet state or the review queue unavailable",
}  # fmt: skip


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return error_responses({c: _DESCRIPTIONS[c] for c in codes})


router = APIRouter()


def page(name: str) -> FileResponse:
    return FileResponse(STATIC / name, media_type="text/html", headers=SECURITY_HEADERS)


@router.get("/console", include_in_schema=False)
async def ask_page() -> FileResponse:
    return page("index.html")


@router.get("/console/fleet", include_in_schema=False)
async def fleet_page() -> FileResponse:
    return page("fleet.html")


router.mount("/console/static", StaticFiles(directory=STATIC), name="console-static")


@router.get("/v1/fleet", response_model=FleetStatus, responses=_errors(401, 503),
            tags=["console"])  # fmt: skip
async def fleet(state: State, who: Who) -> JSONResponse:
    """Live workers (of the pools the key may use) and tenant usage against quota."""
    now = time.time()
    workers = [
        row
        for row in await read_workers(state.bus, now)
        if who.operator or who.may_use_pool(row.pool)
    ]
    tenants = await read_tenants(state.bus, None if who.operator else who.tenant)
    body = FleetStatus(tenant=who.tenant, operator=who.operator, at=now, workers=workers,
                       tenants=tenants)  # fmt: skip
    return JSONResponse(body.model_dump(mode="json"), headers={"Cache-Control": "no-store"})


@router.post(
    "/v1/sql/review", response_model=ReviewQueued, status_code=202, tags=["sql"],
    responses=_errors(400, 401, 403, 413, 422, 503),
)  # fmt: skip
async def request_review(
    body: ReviewBody, request: Request, state: State, who: Who
) -> JSONResponse:
    """Queue a question and its SQL for review: an audit event `review.requested`
    on `audit.review.<tenant>`, listed by `sy sql review --requests`."""
    if not who.may_use_pool(state.settings.sql_pool):
        raise Forbidden("this key may not use the sql pool")
    rid = request_id(request)
    detail: dict[str, Any] = {"note": body.note, "answer_request_id": body.request_id}
    event = AuditEvent(
        tenant=who.tenant, request_id=rid, event=REVIEW_EVENT, actor="edge.console",
        verdict="requested", question=body.question, sql=body.sql,
        sql_hash=sql_hash(body.sql),
        detail={k: v for k, v in detail.items() if v is not None},
    )  # fmt: skip
    try:
        await publish(state.bus.js, subjects.audit("review", who.tenant), event, timeout=5.0)
    except Exception as exc:
        log.warning("edge.review_failed", error=repr(exc)[:200])
        raise Unavailable("the review request could not be stored") from None
    return JSONResponse(ReviewQueued(review_id=rid).model_dump(), 202)
