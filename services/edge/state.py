"""What every route of the edge works with, and the FastAPI dependencies that hand it out.

`EdgeState` is made by the app's lifespan (that is when the bus connects) and kept on
`app.state.edge`; routes never reach for it themselves, they declare `state: State`
and `who: Who` parameters and FastAPI resolves them per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request

from services.edge.auth import KeyRing, Principal
from services.edge.errors import Unavailable
from services.edge.idempotency import Idempotency
from services.edge.settings import EdgeSettings
from switchyard.bus.connection import Bus


@dataclass(frozen=True)
class EdgeState:
    settings: EdgeSettings
    keys: KeyRing
    bus: Bus
    idempotency: Idempotency


async def edge_state(request: Request) -> EdgeState:
    # async: FastAPI runs a plain `def` dependency on its thread pool, a thread hop per call
    state = getattr(request.app.state, "edge", None)
    if not isinstance(state, EdgeState):  # only between two lifespans: starting or stopping
        raise Unavailable("the edge is not connected to the fleet")
    return state


State = Annotated[EdgeState, Depends(edge_state)]


async def principal(
    state: State, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    """The caller, from the Bearer key; a dependency, so it runs before body validation."""
    return state.keys.authenticate(authorization)


Who = Annotated[Principal, Depends(principal)]


def request_id(request: Request) -> str:
    """The id `EdgeMiddleware` gave this request (it names the fleet's work for it)."""
    rid = getattr(request.state, "request_id", None)
    return rid if isinstance(rid, str) else ""


def traceparent(request: Request) -> str | None:
    """The request's W3C trace (the client's, else a new one; see `EdgeMiddleware`)."""
    trace = getattr(request.state, "traceparent", None)
    return trace if isinstance(trace, str) else None
