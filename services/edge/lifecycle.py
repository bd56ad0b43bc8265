"""One request's life on the fleet, for the routes answered by a `GenerateResult` (chat, agent).

`request_lifecycle` is the one place that, in order:

1. claims the request's `Idempotency-Key`, if it has one; a key an earlier request holds
   yields a `Replay` instead (that request's result, never a new run), unless that claim
   looks orphaned (`idempotency.orphaned`): then this request is published under its id,
   and runs as it if the fleet had never stored it;
2. publishes the request (`sends`: chat prepared straight onto REQ, with its record on
   INGRESS; an agent step onto INGRESS) with a reply inbox (`Reply`) and yields a
   `Flight` to read it;
3. while the route waits (`Flight.result`), watches the client: gone -> the wait ends;
4. on the way out, whatever happened: an unfinished request is cancelled on the fleet, a
   claim whose result was not stored (`Flight.finish`) is released so a retry runs anew,
   and the inbox is closed.

A streamed response outlives its route function: the route enters the lifecycle in an
`AsyncExitStack` and hands the stack to the stream (`pop_all()`), whose end runs step 4.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
from fastapi import Request

from services.edge import metrics
from services.edge.errors import NO_OVERRIDES, ApiError, ClientGone, Statuses
from services.edge.idempotency import orphaned
from services.edge.replies import Reply
from services.edge.state import EdgeState
from switchyard import subjects
from switchyard.bus.publish import transient
from switchyard.chatprep import prepared_sends
from switchyard.envelope import Envelope
from switchyard.errors import SwitchyardError
from switchyard.logging import get_logger
from switchyard.messages.idempotency import Claim
from switchyard.messages.inference import (
    ChatRequest,
    ErrorInfo,
    GenerateResult,
    TokenFrame,
    Workload,
)

log = get_logger(__name__)

POLL = 0.25  # s between disconnect checks while waiting for frames


def sends(message: Envelope, chat_pool: str) -> list[tuple[str, Envelope]]:
    """What the edge publishes for `message`, the one that runs it first.

    Chat needs no more preparation than a token estimate, so the edge prepares it itself
    and publishes it straight on `req.llm.<t>` (REQ is durable: nothing is lost), with its
    `ChatRequest` on INGRESS beside it (`llm.edge.<t>`, which nothing consumes) as the
    record `sy replay` and `sy trace` read: the preprocessor hop it skips cost a stream
    write, a delivery and an ack, about 1.5 ms. An agent step goes to the preprocessor."""
    if isinstance(message, ChatRequest):
        return prepared_sends(message, chat_pool)
    return [(subjects.agent_in(message.tenant), message)]


@dataclass(frozen=True)
class Replay:
    """The request's Idempotency-Key is held by an earlier request (same tenant): answer
    with that request's result."""

    state: EdgeState
    tenant: str
    key: str
    workload: Workload
    original: Claim  # the claim in force
    mine: Claim

    @property
    def headers(self) -> dict[str, str]:
        """The original's id: a replayed answer is that request's answer."""
        return {"x-request-id": self.original.request_id, "Idempotent-Replayed": "true"}

    async def result(self) -> GenerateResult:
        """The original's result, waiting for it if it still runs; the key may not be
        reused for a different request."""
        if self.original.fingerprint != self.mine.fingerprint:
            raise ApiError(
                422, "Idempotency-Key reused with a different request", code="idempotency"
            )
        result = self.original.result or await self.state.idempotency.wait_result(
            self.tenant, self.key, self.workload, self.original.request_id,
            self.state.settings.idempotency_wait,
        )  # fmt: skip
        if result is None:
            raise ApiError(409, "the original request is still running", code="idempotency")
        return result


class Flight:
    """A request published to the fleet: its frames, and its claim's result to store."""

    def __init__(
        self, state: EdgeState, request: Request, reply: Reply, claim: Claim | None,
        key: str | None, statuses: Statuses,
    ) -> None:  # fmt: skip
        self.state = state
        self.request = request
        self.reply = reply
        self.tenant = reply.tenant
        self.claim = claim
        self.key = key
        self.statuses = statuses
        self.settled = key is None  # True once nothing is left to release

    @property
    def request_id(self) -> str:
        return self.reply.request_id

    async def next(self, timeout: float | None) -> TokenFrame | None:
        """The next frame, or None if none came within `timeout`; raises a transport error."""
        return await self.reply.next(timeout)

    async def result(self) -> GenerateResult:
        """Wait for the final frame: its result if `ok`, else its HTTP error; ends with
        `ClientGone` if the client goes away first."""
        while True:
            try:
                frame = await self.reply.next(POLL)
            except SwitchyardError as exc:
                raise transport_failure(exc, self.statuses) from None
            if frame is None:
                if await self.request.is_disconnected():
                    raise ClientGone()
            elif frame.type == "end" and frame.result and frame.result.status == "ok":
                return frame.result
            elif frame.type != "delta":
                raise failure(frame, self.statuses)

    async def finish(self, result: GenerateResult) -> None:
        """Store the result under the Idempotency-Key, so a retry gets it (a non-`ok`
        result releases the key instead)."""
        if self.key is not None and self.claim is not None:
            await self.state.idempotency.finish(self.tenant, self.key, self.claim, result)
        self.settled = True

    async def close(self) -> None:
        """Step 4: cancel what did not finish, release an unstored claim, close the inbox."""
        with anyio.CancelScope(shield=True):
            if not self.reply.finished:
                await cancel(self.reply, "client")
            if not self.settled and self.key is not None:
                await self.state.idempotency.release(self.tenant, self.key)
            await self.reply.close()


@contextlib.asynccontextmanager
async def request_lifecycle(
    state: EdgeState, request: Request, workload: Workload, message: Envelope,
    *, key: str | None, fingerprint: str, statuses: Statuses = NO_OVERRIDES,
) -> AsyncIterator[Flight | Replay]:  # fmt: skip
    """Claim `key` (if given) for `message`, publish it, and clean up after it; see the
    module's docstring. `fingerprint` identifies the request's content, so a key reused
    for a different request is refused; `statuses` are the route's over `errors.STATUS`."""
    claim, adopting = None, False
    if key:
        claim = Claim(request_id=message.id, fingerprint=fingerprint)
        held, ours = await state.idempotency.claim(message.tenant, key, claim)
        if not ours:
            if not orphaned(held, fingerprint):
                yield Replay(state, message.tenant, key, workload, held, claim)
                return
            adopting, mine = True, claim
            claim, message = held, message.model_copy(update={"id": held.request_id})
    reply = Reply(state.bus, idle_timeout=state.settings.idle_timeout)
    try:
        stored = await reply.start(sends(message, state.settings.chat_pool))
    except BaseException as exc:
        if not adopting:  # (an adopted claim's id may still be its running original's)
            with anyio.CancelScope(shield=True):
                # The client gets an error: a part that was stored (REQ took the chat,
                # INGRESS failed its record) must not run on for nobody.
                await cancel(reply, "unpublished")
                if key:
                    await state.idempotency.release(message.tenant, key)
        if transient(exc):  # still so after INGRESS_PATIENCE of retries
            raise ApiError(
                503, f"the fleet did not take the request: {type(exc).__name__}",
                "service_unavailable_error", "bus_unavailable", retry_after=1.0,
            ) from None  # fmt: skip
        raise
    if adopting and claim is not None and key:
        if not stored:  # the original reached the fleet after all: wait for its answer
            await reply.close()
            yield Replay(state, message.tenant, key, workload, claim, mine)
            return
        log.warning("edge.idempotency_adopted", request_id=message.id, tenant=message.tenant)
        request.state.request_id = message.id  # the answer names the request it is
    flight = Flight(state, request, reply, claim, key or None, statuses)
    try:
        yield flight
    finally:
        await flight.close()


async def cancel(reply: Reply, reason: str) -> None:
    metrics.CANCELS.labels(reason).inc()
    log.info("edge.cancel", request_id=reply.request_id, reason=reason)
    with contextlib.suppress(Exception):
        await reply.cancel(reason)


def failure(frame: TokenFrame, statuses: Statuses = NO_OVERRIDES) -> ApiError:
    """The HTTP error of a final frame that is not a success."""
    if frame.error is not None:
        return ApiError.from_info(frame.error, statuses)
    if frame.result is not None:
        return ApiError.from_result(frame.result, statuses)
    return ApiError(500, "reply stream ended without a result", "server_error", "internal")


def transport_failure(exc: SwitchyardError, statuses: Statuses = NO_OVERRIDES) -> ApiError:
    """The HTTP error of a reply stream that broke (went silent, undecodable frame...)."""
    return ApiError.from_info(ErrorInfo(code=exc.code, reason=exc.reason[:1000]), statuses)
