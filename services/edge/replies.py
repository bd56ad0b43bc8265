"""How an answer leaves the edge: its JSON body, and its `Server-Timing` header."""

from __future__ import annotations

import time
from collections.abc import Mapping

from fastapi import Response
from pydantic import BaseModel

from switchyard.messages.inference import GenerateResult


def server_timing(result: GenerateResult) -> dict[str, str]:
    """The `Server-Timing` header (W3C) of an answer: milliseconds per hop of its way
    through the fleet (`Route.hops`: prepare, to_router, router, to_worker, engine, back),
    for browsers' developer tools, `curl -i` and `sy bench peers`."""
    if result.route is None:
        return {}
    hops = result.route.hops(time.time())
    return {"Server-Timing": ", ".join(f"{h};dur={s * 1000:.2f}" for h, s in hops.items())}


def json_answer(answer: BaseModel, headers: Mapping[str, str] | None = None) -> Response:
    """`answer` as an `application/json` response, serialised by pydantic-core straight to
    bytes (what `JSONResponse(answer.model_dump())` makes, without the dict in between)."""
    return Response(answer.model_dump_json(), media_type="application/json", headers=headers)
