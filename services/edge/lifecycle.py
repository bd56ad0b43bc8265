"""One request's life on the fleet, for every route the fleet answers: chat and agent steps
(a `GenerateResult`), SQL questions (a `SqlAnswer`).

`request_lifecycle` is the one place that, in order:

1. claims the request's `Idempotency-Key`, if it has one; a key an earlier request holds
   yields a `Replay` instead (that request's final, never a new run), unless that claim
   looks orphaned (`idempotency.orphaned`): then this request is published under its id,
   and runs as it if the fleet had never stored it;
2. publishes the request (`sends`: chat prepared straight onto REQ, with its record on
   INGRESS; an agent step or a question onto INGRESS) with a reply inbox (`bus.reply`,
   patient through a leader election) and yields a `Flight` to read it;
3. while the route waits (`Flight.result`), watches the client: gone -> the wait ends;
4. on the way out, whatever happened: an unfinished request is cancelled on the fleet, a
   claim whose final was not stored (`Flight.finish`) is released so a retry runs anew,
   and the inbox is closed.

A streamed response outlives its route function: the route enters the lifecycle in an
`AsyncExitStack` and hands the stack to the stream (`sse.events`), whose end runs step 4.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Generic

import anyio
from fastapi import Request

from services.edge import metrics
from services.edge.errors import NO_OVERRIDES, ApiError, ClientGone, Statuses
from services.edge.idempotency import orphaned
from services.edge.state import EdgeState
from switchyard import subjects
from switchyard.bus.publish import INGRESS_PATIENCE, transient
from switchyard.bus.reply import Final, Progress, Reply, error_info, failure
from switchyard.chatprep import prepared_sends
from switchyard.envelope import Envelope
from switchyard.errors import SwitchyardError
from switchyard.logging import get_logger
from switchyard.messages.idempotency import Claim
from switchyard.messages.inference import ChatRequest, GenerateResult, TokenFrame, Workload
from switchyard.messages.sql import SqlAsk, StageProgress

log = get_logger(__name__)

POLL = 0.25  # s between disconnect checks while waiting for frames


def sends(message: Envelope, chat_pool: str) -> list[tuple[str, Envelope]]:
    """What the edge publishes for `message`, the one that runs it first.

    Chat needs no more preparation than a token estimate, so the edge prepares it itself
    and publishes it straight on `req.llm.<t>` (REQ is durable: nothing is lost), with its
    `ChatRequest` on INGRESS beside it (`llm.edge.<t>`, which nothing consumes) as the
    record `sy replay` and `sy trace` read: the preprocessor hop it skips cost a stream
    write, a delivery and an ack, about 1.5 ms. An agent step goes to the preprocessor,
    a question to sqlflow."""
    if isinstance(message, ChatRequest):
        return prepared_sends(message, chat_pool)
    if isinstance(message, SqlAsk):
        return [(subjects.sql_in(message.tenant), message)]
    return [(subjects.agent_in(message.tenant), message)]


@dataclass(frozen=True)
class Replay(Generic[Final]):
    """The request's Idempotency-Key is held by an earlier request (same tenant): answer
    with that request's final."""

    state: EdgeState
    tenant: str
    key: str
    workload: Workload
    final: type[Final]
    original: Claim  # the claim in force
    mine: Claim

    @property
    def headers(self) -> dict[str, str]:
        """The original's id: a replayed answer is that request's answer."""
        return {"x-request-id": self.original.request_id, "Idempotent-Replayed": "true"}

    async def result(self) -> Final:
        """The original's final, waiting for it if it still runs; the key may not be
        reused for a different request."""
        if self.original.fingerprint != self.mine.fingerprint:
            raise ApiError(
                422, "Idempotency-Key reused with a different request", code="idempotency"
            )
        stored = self.original.result
        result = stored if isinstance(stored, self.final) else None
        result = result or await self.state.idempotency.wait_result(
            self.tenant, self.key, self.workload, self.final, self.original.request_id,
            self.state.settings.idempotency_wait,
        )  # fmt: skip
        if result is None:
            raise ApiError(409, "the original request is still running", code="idempotency")
        return result


class Flight(Generic[Final]):
    """A request published to the fleet: its progress and final, and its claim's final
    to store."""

    def __init__(
        self, state: EdgeState, request: Request, reply: Reply[Final], claim: Claim | None,
        key: str | None, statuses: Statuses,
    ) -> None:  # fmt: skip
        self.state = state
        self.request = request
        self.reply: Reply[Final] = reply
        self.tenant = reply.tenant
        self.claim = claim
        self.key = key
        self.statuses = statuses
        self.settled = key is None  # True once nothing is left to release
        # perf_counter times (`middleware`): the request's arrival, the fleet storing it,
        # its first token read back, for the latency its client feels (`_observe`).
        self.arrived: float = getattr(request.state, "arrived", time.perf_counter())
        self.published = time.perf_counter()
        self.first_token: float | None = None

    @property
    def request_id(self) -> str:
        return self.reply.request_id

    async def next(self, timeout: float | None) -> Progress | Final | None:
        """The next progress item or the final, or None if none came within `timeout`;
        raises the HTTP error of a refusal or a broken reply (silent, undecodable)."""
        try:
            item = await self.reply.next(timeout)
        except SwitchyardError as exc:
            raise ApiError.from_info(error_info(exc), self.statuses) from None
        self._observe(item)
        return item

    def _observe(self, item: Progress | Final | None) -> None:
        """An answer's latency at the edge, once its result names the pool."""
        now = time.perf_counter()
        if isinstance(item, TokenFrame) and item.text and self.first_token is None:
            self.first_token = now
        if not isinstance(item, GenerateResult) or item.status != "ok" or item.route is None:
            return
        pool, workload = item.route.pool, item.workload
        first = now if self.first_token is None else self.first_token  # not streamed: now
        metrics.TTFT.labels(pool, workload).observe(first - self.arrived)
        metrics.DURATION.labels(pool, workload).observe(now - self.arrived)
        metrics.PHASES.labels(pool, "edge").observe(self.published - self.arrived)
        metrics.PHASES.labels(pool, "fleet").observe(now - self.published)

    async def first(self, grace: float) -> Progress | Final | None:
        """What comes within `grace`, before a stream commits to its 200: a refusal, or a
        final that is not an answer, is then a real HTTP status."""
        until = time.monotonic() + grace
        item = await self.next(grace)
        # A question's keepalive (sqlflow sends one as it takes it) says it is worked on,
        # not how it went: it commits nothing, and the grace goes on for a refusal.
        while isinstance(item, StageProgress) and (left := until - time.monotonic()) > 0:
            item = await self.next(left) or item
        if isinstance(item, self.reply.final):
            self.check(item)
        return item

    def check(self, final: Final) -> Final:
        """`final` if it is an answer, else raises its HTTP error."""
        if (err := refusal(final, self.statuses)) is not None:
            raise err
        return final

    async def result(self) -> Final:
        """Wait for the final: itself if an answer, else its HTTP error; ends with
        `ClientGone` if the client goes away first."""
        while True:
            item = await self.next(POLL)
            if item is None:
                if await self.request.is_disconnected():
                    raise ClientGone()
            elif isinstance(item, self.reply.final):
                return self.check(item)

    async def finish(self, result: Final) -> None:
        """Store the final under the Idempotency-Key, so a retry gets it (one that is not
        an answer releases the key instead)."""
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
    state: EdgeState, request: Request, workload: Workload, final: type[Final],
    message: Envelope, *, key: str | None, fingerprint: Callable[[], str],
    idle_timeout: float | None = None, first_timeout: float | None = None,
    statuses: Statuses = NO_OVERRIDES,
) -> AsyncIterator[Flight[Final] | Replay[Final]]:  # fmt: skip
    """Claim `key` (if given) for `message`, publish it, and clean up after it; see the
    module's docstring. `fingerprint()` identifies the request's content, so a key reused
    for a different request is refused (asked only when there is a key: it hashes the
    body); `statuses` are the route's over `errors.STATUS`."""
    claim, adopting = None, False
    if key:
        mine = Claim(request_id=message.id, fingerprint=fingerprint())
        held, ours = await state.idempotency.claim(message.tenant, key, mine)
        claim = held
        if not ours:
            if not orphaned(held, mine.fingerprint):
                yield Replay(state, message.tenant, key, workload, final, held, mine)
                return
            adopting, message = True, message.model_copy(update={"id": held.request_id})
    idle = idle_timeout or state.settings.idle_timeout
    reply: Reply[Final] = Reply(state.bus, final, idle_timeout=idle, first_timeout=first_timeout)
    try:
        stored = await reply.start(sends(message, state.settings.chat_pool),
                                   patience=INGRESS_PATIENCE)  # fmt: skip
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
            yield Replay(state, message.tenant, key, workload, final, claim, mine)
            return
        log.warning("edge.idempotency_adopted", request_id=message.id, tenant=message.tenant)
        request.state.request_id = message.id  # the answer names the request it is
    flight = Flight(state, request, reply, claim, key or None, statuses)
    try:
        yield flight
    finally:
        await flight.close()


def refusal(final: Final, statuses: Statuses = NO_OVERRIDES) -> ApiError | None:
    """The HTTP error of a final that is not an answer (`reply.failure`), else None."""
    info = failure(final)
    return None if info is None else ApiError.from_info(info, statuses)


async def cancel(reply: Reply[Final], reason: str) -> None:
    metrics.CANCELS.labels(reason).inc()
    log.info("edge.cancel", request_id=reply.request_id, reason=reason)
    with contextlib.suppress(Exception):
        await reply.cancel(reason)
