"""What operators and orchestrators poll: `/healthz`, `/readyz` and `/metrics`."""

from __future__ import annotations

import contextlib
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.edge.state import State
from switchyard.bus.connection import Bus
from switchyard.bus.kvkeys import kv_keys
from switchyard.bus.topology import WORKERS_BUCKET
from switchyard.codec import decode
from switchyard.messages.fleet import WorkerHeartbeat

# The streams a chat request crosses: without one of them the edge is not ready.
STREAMS = ("INGRESS", "REQ", "WORK", "RES")

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "Not ready"}})
async def readyz(state: State, pool: str | None = None) -> JSONResponse:
    checks = await readiness(state.bus, pool or state.settings.chat_pool)
    ok = all(bool(v) for v in checks.values())
    return JSONResponse({"ready": ok, **checks}, 200 if ok else 503)


@router.get("/metrics", response_class=Response)
async def prometheus() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


async def readiness(bus: Bus, pool: str) -> dict[str, Any]:
    """NATS connected, the streams there, and how many live workers serve `pool`."""
    checks: dict[str, Any] = {"nats": bus.nc.is_connected, "streams": False, "workers": 0}
    if not bus.nc.is_connected:
        return checks
    try:
        for name in STREAMS:
            await bus.js.stream_info(name)
        checks["streams"] = True
        kv = await bus.js.key_value(WORKERS_BUCKET)
        with contextlib.suppress(Exception):
            for worker in await kv_keys(bus.js, WORKERS_BUCKET):
                with contextlib.suppress(Exception):
                    entry = await kv.get(worker)
                    if entry.value:
                        beat = decode(entry.value, WorkerHeartbeat)
                        if beat.pool == pool and not beat.draining:
                            checks["workers"] += 1
    except Exception as exc:  # a missing stream or bucket: not ready, and say why
        checks["error"] = str(exc)[:200]
    return checks
