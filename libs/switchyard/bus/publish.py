"""Publishing envelopes to JetStream with dedupe ids and trace context."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import PubAck
from pydantic import BaseModel

from switchyard.backoff import Backoff
from switchyard.codec import encode
from switchyard.envelope import Envelope
from switchyard.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")

MSG_ID = "Nats-Msg-Id"
TRACEPARENT = "traceparent"

# What the bus answers while a stream has no leader (a JetStream cluster electing one
# after a node died) or the connection is between servers: worth trying again, briefly.
# (Callers that catch "the bus is away" on reads use this tuple; what a patient publish
# tries again is `transient()`, which adds the JetStream API errors below.)
UNAVAILABLE: tuple[type[Exception], ...] = (
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.TimeoutError,
)

# JetStream API errors by `err_code` (nats-server's server/errors.json), each decided:
# True = the same request, sent again with the same `Nats-Msg-Id`, may succeed soon;
# False = it never will, raise at once. Read against nats-server's source (stream.go,
# jetstream_cluster.go, jetstream_batching.go) for where a publish can get each.
JS_ERRORS: dict[int, bool] = {
    # 409 "duplicate message id is in process": the first try of this very message is
    # proposed in the stream's Raft group but not yet applied (its ack timed out during a
    # failover or partition). Trying again returns the duplicate ack once it is stored,
    # or stores it if the proposal was lost with its leader.
    10158: True,
    # 429 "too many requests": the stream's ingest queue is full (`max_buffered_msgs` /
    # `max_buffered_size`); the message was dropped before it was proposed.
    10167: True,
    # 503 "JetStream system temporarily unavailable": no meta leader (an election).
    10008: True,
    # 503 "insufficient resources": this server's JetStream limits; its stream leader steps
    # down on it, so the next leader (another server) may store the message.
    10023: True,
    # 503 "{err}" a store failed (a full stream with discard new, an I/O error, which stops
    # the replica and moves the leader): backpressure or a failover, within the patience.
    10077: True,
    # 503 "expected last sequence per subject temporarily unavailable": defined for KV
    # writes (`create`/`update`) on a leader not caught up yet; not sent by the 2.12+
    # source read, decided all the same.
    10163: True,
    # 503 but a configuration, not a moment: JetStream not enabled (for the account).
    10076: False,
    10039: False,
}


def transient(exc: BaseException) -> bool:
    """Whether `exc` from a publish or a JetStream API call is worth the same call again
    (`JS_ERRORS`): the bus away (`UNAVAILABLE`), or an API error decided so. A 503 whose
    code is not in the table (or that came as a bare status, without one) counts as
    unavailable, the server's own word for it; any other API error does not."""
    if isinstance(exc, nats.js.errors.APIError) and exc.err_code is not None:
        decided = JS_ERRORS.get(exc.err_code)
        if decided is not None:
            return decided
    return isinstance(exc, UNAVAILABLE)


# How long a service keeps trying to store what it must not lose (a result, a prepared
# request, an audit event) while the bus is unavailable: longer than a JetStream cluster
# takes to elect a new stream leader after losing a node (2-10 s measured here), shorter
# than anyone waiting for the answer would. The message id makes every retry safe.
FAILOVER_PATIENCE = 30.0
# How long a request waits for its streams to take it while a cluster elects a leader
# (`reply.Reply.start`): the asker waits seconds for its answer instead of failing at
# once and retrying into the same election.
INGRESS_PATIENCE = 15.0
# One attempt's wait for the stream's ack while being patient: a publish to a leader that
# just died is never answered, so waiting the context's whole timeout (10 s) for it
# would be the longest part of a failover. Acks take milliseconds; a slow one is retried,
# and the message id makes the retry land once.
PATIENT_ATTEMPT = 2.0
# Between tries: from ~0.1 s (a leader elected in a moment) up to 2 s (a slow election).
PATIENT_BACKOFF = Backoff(first=0.1, cap=2.0)


def trace_headers(message: BaseModel, msg_id: str | None = None) -> dict[str, str]:
    headers: dict[str, str] = {}
    if isinstance(message, Envelope):
        headers[MSG_ID] = msg_id or message.id
        if message.trace:
            headers[TRACEPARENT] = message.trace
    elif msg_id:
        headers[MSG_ID] = msg_id
    return headers


async def publish(
    js: JetStreamContext,
    subject: str,
    message: BaseModel,
    *,
    msg_id: str | None = None,
    timeout: float | None = None,
    patience: float = 0.0,
) -> PubAck:
    """Publish and wait for the stream's ack. `Nats-Msg-Id` defaults to the envelope id,
    so a retried publish inside the stream's duplicate window is stored once.

    `patience`: for how many seconds a `transient()` error is tried again (`patiently`,
    the same message id each time) before it is raised; 0 raises it at once."""
    data, headers = encode(message), trace_headers(message, msg_id)
    if patience and timeout is None:
        timeout = PATIENT_ATTEMPT

    async def attempt() -> PubAck:
        return await js.publish(subject, data, headers=dict(headers), timeout=timeout)

    return await patiently(attempt, patience, what=subject)


async def patiently(
    attempt: Callable[[], Awaitable[T]], patience: float, *, what: str,
    backoff: Backoff = PATIENT_BACKOFF,
) -> T:  # fmt: skip
    """`attempt()`, tried again while its error is `transient()` (a cluster electing a
    stream's leader, a first try still being stored, a full ingest queue) for up to
    `patience` seconds, waiting `backoff` (jittered) between tries; then its error is
    raised (at once when `patience` is 0 or the error is not transient)."""
    deadline = time.monotonic() + patience
    failures = 0
    while True:
        try:
            return await attempt()
        except Exception as exc:
            delay = backoff.delay(failures)
            if not transient(exc) or time.monotonic() + delay > deadline:
                raise
            failures += 1
            # str(): nats-py's API errors say their codes there, not in their repr.
            error = f"{type(exc).__name__}: {exc}"
            log.info("bus.publish_retry", subject=what, error=error, delay=round(delay, 3))
            await asyncio.sleep(delay)
