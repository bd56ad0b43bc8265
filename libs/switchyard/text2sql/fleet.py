"""Model calls of the Text2SQL pipeline, made through the fleet like any other request.

A call is a `GenerateRequest` on `req.sql.<tenant>`: the router admits it under
the tenant's quotas and places it by tenant (its schema prompt is the shared
prefix), `cache_salt` = tenant keeps one tenant's cached prefix from ever being
reused by another, and `lora` picks the tenant's adapter when one is configured.
The reply comes back as a token stream (`bus.reply`); the request is published
patiently through a leader election, as every asker's is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from switchyard import otel, subjects
from switchyard.bus.connection import Bus
from switchyard.bus.reply import Refused, Reply, failure
from switchyard.errors import SwitchyardError
from switchyard.messages.inference import (
    ChatMessage,
    Constraint,
    GenerateRequest,
    GenerateResult,
    NoConstraint,
    Sampling,
    TokenFrame,
)
from switchyard.token_estimate import estimate_tokens


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
        tracer: otel.Tracer = otel.OFF,
    ) -> None:
        self.bus = bus
        self.tracer = tracer
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
        streamed: Callable[[int], None] | None = None,
    ) -> Completion:
        """`streamed(n)` is told of each delta's `n` output tokens as they arrive (how far
        the call has got, for the question's keepalive frames)."""
        # Its own span, so the router and worker that run it are under this call.
        with self.tracer.hop("sqlflow.model", trace, model=self.model) as call:
            started = time.perf_counter()
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
                trace=call.traceparent,
                prepared_at=time.time(),
            )
            async with Reply(self.bus, GenerateResult, idle_timeout=self.idle_timeout) as reply:
                await reply.start([(subjects.req("sql", tenant), req)])
                try:
                    async for item in reply:
                        if isinstance(item, TokenFrame) and streamed is not None:
                            streamed(item.tokens)
                        if isinstance(item, GenerateResult):
                            if (info := failure(item)) is not None:
                                raise SwitchyardError(
                                    f"model call {item.status}: {info.reason}", code=info.code
                                )
                            return Completion(item.text, item, req, time.perf_counter() - started)
                except Refused as exc:
                    raise SwitchyardError(
                        f"model call failed: {exc.reason}", code=exc.code
                    ) from None
                except asyncio.CancelledError:
                    # The question was cancelled: stop the model too (best effort).
                    with contextlib.suppress(Exception):
                        await asyncio.shield(reply.cancel("question"))
                    raise
            raise SwitchyardError("model stream ended without a result", code="engine_error")
