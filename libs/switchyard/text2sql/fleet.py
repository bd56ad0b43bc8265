"""Model calls of the Text2SQL pipeline, made through the fleet like any other request.

A call is a `GenerateRequest` on `req.sql.<tenant>`: the router admits it under
the tenant's quotas and places it by tenant (its schema prompt is the shared
prefix), `cache_salt` = tenant keeps one tenant's cached prefix from ever being
reused by another, and `lora` picks the tenant's adapter when one is configured.
The reply comes back as a token stream on our own inbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.codec import encode
from switchyard.errors import SwitchyardError
from switchyard.messages.inference import (
    Cancel,
    ChatMessage,
    Constraint,
    GenerateRequest,
    GenerateResult,
    NoConstraint,
    Sampling,
)
from switchyard.token_estimate import estimate_tokens
from switchyard.tracing import child


@dataclass(frozen=True)
class Completion:
    text: str
    result: GenerateResult
    request: GenerateRequest
    seconds: float


class FleetModel:
    """`complete()` one prompt on the fleet's `sql` pool and wait for the whole text."""

    def __init__(
        self,
        bus: Bus,
        *,
        pool: str = "sql",
        model: str = "default",
        lora: str | None = None,
        idle_timeout: float = 30.0,
    ) -> None:
        self.bus = bus
        self.pool = pool
        self.model = model
        self.lora = lora
        self.idle_timeout = idle_timeout

    async def complete(
        self,
        tenant: str,
        messages: list[ChatMessage],
        *,
        constraint: Constraint | None = None,
        max_tokens: int = 256,
        deadline: float | None = None,
        trace: str | None = None,
    ) -> Completion:
        started = time.perf_counter()
        async with TokenStreamReader(self.bus.nc, idle_timeout=self.idle_timeout) as stream:
            req = GenerateRequest(
                tenant=tenant,
                workload="sql",
                pool=self.pool,
                model=self.model,
                messages=messages,
                sampling=Sampling(max_tokens=max_tokens, temperature=0.0, seed=0),
                constraint=constraint or NoConstraint(),
                lora=self.lora,
                cache_salt=tenant,
                prompt_tokens=estimate_tokens(messages),
                deadline=deadline,
                trace=child(trace),
                reply=stream.inbox,
                prepared_at=time.time(),
            )
            await publish(self.bus.js, subjects.req("sql", tenant), req)
            try:
                return await self._read(stream, req, started)
            except asyncio.CancelledError:
                # The question was cancelled: stop the model too (core NATS, best effort).
                with contextlib.suppress(Exception):
                    cancel = Cancel(tenant=tenant, request_id=req.id, reason="question")
                    await asyncio.shield(
                        self.bus.nc.publish(subjects.cancel(req.id), encode(cancel))
                    )
                raise

    async def _read(
        self, stream: TokenStreamReader, req: GenerateRequest, started: float
    ) -> Completion:
        async for frame in stream:
            if frame.type == "error" and frame.error is not None:
                raise SwitchyardError(
                    f"model call failed: {frame.error.reason}", code=frame.error.code
                )
            if frame.type == "end" and frame.result is not None:
                result = frame.result
                if result.status != "ok":
                    info = result.error
                    raise SwitchyardError(
                        f"model call {result.status}: {info.reason if info else '-'}",
                        code=info.code if info else "engine_error",
                    )
                return Completion(result.text, result, req, time.perf_counter() - started)
        raise SwitchyardError("model stream ended without a result", code="engine_error")
