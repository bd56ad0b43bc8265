"""`Idempotency-Key` -> one request id, in KV `idempotency` (the bucket's TTL expires it).

The first request with a key claims it (KV create, so two racing edges cannot
both win) and records its id; it stores its final (a `GenerateResult`, a `SqlAnswer`)
when that is an answer. A retry of a finished request gets the stored final; a retry of
a running one waits for that request's final on `res.<workload>.<tenant>` (or finds it on
RES, when it finished but its claim could not be updated) instead of running again. A
failed or cancelled request releases its key so a retry runs anew.
Keys are scoped by tenant: another tenant's identical key is a different entry.

An edge that dies between claiming a key and publishing its request leaves a claim no
request will ever finish. A retry of a claim that is still running `ORPHAN_AFTER` after
its request was made publishes its own (identical) request under the claim's request id
(`orphaned`): the stream it goes to (REQ for chat, INGRESS for agent steps and questions)
dedupes ids,
so if the original did reach the fleet nothing new is stored and the retry waits for
that one's result; if it never did, the retry's copy runs as the original.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time

from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from services.edge.errors import ApiError
from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import FAILOVER_PATIENCE, INGRESS_PATIENCE, UNAVAILABLE, patiently
from switchyard.bus.reply import Final, failure
from switchyard.bus.streamread import Window, read
from switchyard.bus.topology import IDEMPOTENCY_BUCKET, StreamSpec
from switchyard.codec import decode, encode
from switchyard.errors import DecodeError
from switchyard.ids import id_time
from switchyard.messages.idempotency import Claim
from switchyard.messages.inference import Workload

CLAIM_ATTEMPTS = 3  # a key released between our create and our read is claimed afresh
# A live edge has published its request (or released the key) this long after making it:
# its publish gives up after INGRESS_PATIENCE.
ORPHAN_AFTER = INGRESS_PATIENCE + 5.0
# Only while the stream still dedupes the original's id can a copy be published safely.
ORPHAN_BEFORE = StreamSpec.duplicate_window - 20.0


def orphaned(claim: Claim, fingerprint: str, now: float | None = None) -> bool:
    """Whether `claim` may have been left by an edge that died before publishing its
    request, so a retry of the same request should publish it again under its id."""
    age = (time.time() if now is None else now) - id_time(claim.request_id)
    return (
        claim.state == "running" and claim.result is None and claim.fingerprint == fingerprint
        and ORPHAN_AFTER <= age < ORPHAN_BEFORE
    )  # fmt: skip


def fingerprint(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:64]


def kv_key(tenant: str, key: str) -> str:
    return f"{tenant}.{hashlib.sha256(key.encode()).hexdigest()[:40]}"


class Idempotency:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._kv: KeyValue | None = None

    async def kv(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self.bus.js.key_value(IDEMPOTENCY_BUCKET)
        return self._kv

    async def claim(self, tenant: str, key: str, claim: Claim) -> tuple[Claim, bool]:
        """(the claim in force, whether it is ours)."""
        kv = await self.kv()
        name = kv_key(tenant, key)
        for _ in range(CLAIM_ATTEMPTS):
            with contextlib.suppress(KeyWrongLastSequenceError):
                await kv.create(name, encode(claim))
                return claim, True
            # Held: read whose. A holder that released it in between: try again.
            with contextlib.suppress(KeyNotFoundError):
                entry = await kv.get(name)
                if entry.value:
                    return decode(entry.value, Claim), False
        raise ApiError(409, "the Idempotency-Key is being claimed and released; retry",
                       code="idempotency")  # fmt: skip

    async def finish(self, tenant: str, key: str, claim: Claim, result: Final) -> None:
        if failure(result) is None:
            done = claim.model_copy(update={"state": "done", "result": result})

            async def put() -> None:
                await (await self.kv()).put(kv_key(tenant, key), encode(done))

            await patiently(put, FAILOVER_PATIENCE, what=kv_key(tenant, key))
        else:
            await self.release(tenant, key)

    async def release(self, tenant: str, key: str) -> None:
        """Give the key up (the request failed or never left): tried through a bucket's
        leader election, since a claim left behind would refuse every retry for a day."""

        async def delete() -> None:
            with contextlib.suppress(KeyNotFoundError):
                await (await self.kv()).delete(kv_key(tenant, key))

        await patiently(delete, FAILOVER_PATIENCE, what=kv_key(tenant, key))

    async def wait_result(
        self, tenant: str, key: str, workload: Workload, final: type[Final], request_id: str,
        timeout: float,
    ) -> Final | None:  # fmt: skip
        """The final of a running claim: from KV if it already finished, else from RES."""
        found: asyncio.Future[Final] = asyncio.get_running_loop().create_future()

        async def on_result(msg: Msg) -> None:
            with contextlib.suppress(DecodeError):
                result = decode(msg.data, final)
                if result.request_id == request_id and not found.done():
                    found.set_result(result)

        # Subscribe before re-reading KV, so a result published in between is not missed.
        sub = await self.bus.nc.subscribe(subjects.res(workload, tenant), cb=on_result)
        try:
            kv = await self.kv()
            with contextlib.suppress(KeyNotFoundError):
                entry = await kv.get(kv_key(tenant, key))
                if entry.value:
                    claim = decode(entry.value, Claim)
                    if isinstance(claim.result, final) and claim.request_id == request_id:
                        return claim.result
            # Finished already, but its claim was not updated (the bucket had no leader
            # when the original edge tried, or that edge died): RES has the result.
            stored = await self._stored_result(workload, final, tenant, request_id)
            if stored is not None:
                return stored
            try:
                return await asyncio.wait_for(found, timeout)
            except TimeoutError:
                return None
        finally:
            await sub.unsubscribe()

    async def _stored_result(
        self, workload: Workload, final: type[Final], tenant: str, request_id: str
    ) -> Final | None:
        """`request_id`'s result if RES holds one: the tenant's results since the request
        was made (its id says when), read without a durable consumer."""
        window = Window(subject=subjects.res(workload, tenant), since=id_time(request_id) - 1)
        try:
            async for stored in read(self.bus.js, "RES", window):
                with contextlib.suppress(DecodeError):
                    result = decode(stored.data, final)
                    if result.request_id == request_id:
                        return result
        except UNAVAILABLE:
            return None
        return None
