"""`Idempotency-Key` -> one request id, in KV `idempotency` (the bucket's TTL expires it).

The first request with a key claims it (KV create, so two racing edges cannot
both win) and records its id; it stores the result when it succeeds. A retry
of a finished request gets the stored result; a retry of a running one waits
for that request's result on `res.<workload>.<tenant>` instead of generating
again. A failed or cancelled request releases its key so a retry runs anew.
Keys are scoped by tenant: another tenant's identical key is a different entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib

from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from services.edge.errors import ApiError
from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.topology import IDEMPOTENCY_BUCKET
from switchyard.codec import decode, encode
from switchyard.errors import DecodeError
from switchyard.messages.idempotency import Claim
from switchyard.messages.inference import GenerateResult, Workload

CLAIM_ATTEMPTS = 3  # a key released between our create and our read is claimed afresh


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

    async def finish(self, tenant: str, key: str, claim: Claim, result: GenerateResult) -> None:
        kv = await self.kv()
        if result.status == "ok":
            done = claim.model_copy(update={"state": "done", "result": result})
            await kv.put(kv_key(tenant, key), encode(done))
        else:
            await self.release(tenant, key)

    async def release(self, tenant: str, key: str) -> None:
        kv = await self.kv()
        with contextlib.suppress(KeyNotFoundError):
            await kv.delete(kv_key(tenant, key))

    async def wait_result(
        self, tenant: str, key: str, workload: Workload, request_id: str, timeout: float
    ) -> GenerateResult | None:
        """The result of a running claim: from KV if it already finished, else from RES."""
        found: asyncio.Future[GenerateResult] = asyncio.get_running_loop().create_future()

        async def on_result(msg: Msg) -> None:
            with contextlib.suppress(DecodeError):
                result = decode(msg.data, GenerateResult)
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
                    if claim.result is not None and claim.request_id == request_id:
                        return claim.result
            try:
                return await asyncio.wait_for(found, timeout)
            except TimeoutError:
                return None
        finally:
            await sub.unsubscribe()
