"""Runs one `GenerateRequest` on the engine and answers it exactly once.

The answer goes to `RES` first (deduplicated by `res-<request id>`, so a
redelivered request that an earlier attempt already answered is not answered
again), then as the end frame of the token stream, then the WORK message is
acked by the pull loop. A request whose deadline passed or whose frame is stale
is answered without touching the engine.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.js import JetStreamContext

from services.worker import metrics
from switchyard.agentprompt import Geometry, answer_to_original
from switchyard.answers import answer, result_for, route_of
from switchyard.bus.tokenstream import TokenStreamWriter
from switchyard.engines.base import Engine, EngineRequest
from switchyard.engines.sim import SimEngine
from switchyard.errors import ErrorCode, SwitchyardError
from switchyard.logging import bind_request, get_logger
from switchyard.messages.inference import (
    ErrorInfo,
    FinishReason,
    GenerateRequest,
    ModelledTimings,
    ResultStatus,
    Timings,
    Usage,
)

log = get_logger(__name__)


@dataclass
class Outcome:
    status: ResultStatus
    text: str = ""
    finish_reason: FinishReason | None = None
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
    error: ErrorInfo | None = None
    started_at: float | None = None
    first_token_at: float | None = None


class Runner:
    def __init__(self, nc: Client, js: JetStreamContext, engine: Engine, worker_id: str) -> None:
        self.nc = nc
        self.js = js
        self.engine = engine
        self.worker_id = worker_id
        self.running: set[str] = set()
        self.cancelled: dict[str, float] = {}  # request id -> when the cancel arrived

    async def cancel(self, request_id: str) -> None:
        self.cancelled[request_id] = time.time()
        cutoff = time.time() - 600  # a cancel older than any queue wait is forgotten
        for rid in [r for r, at in self.cancelled.items() if at < cutoff]:
            del self.cancelled[rid]
        if request_id in self.running:
            await self.engine.abort(request_id)

    async def handle(self, req: GenerateRequest, attempt: int = 1) -> None:
        with bind_request(req.id, req.tenant, req.trace):
            writer = TokenStreamWriter(self.nc, req.reply, attempt=attempt) if req.reply else None
            outcome = await self._run(req, writer)
            result = result_for(
                req,
                outcome.status,
                outcome.error,
                text=outcome.text,
                finish_reason=outcome.finish_reason,
                usage=outcome.usage,
                timings=outcome.timings,
                worker=self.worker_id,
                route=route_of(req, time.time(), outcome.started_at, outcome.first_token_at),
            )
            metrics.RESULTS.labels(outcome.status).inc()
            if not await answer(self.nc, self.js, req, result, writer):
                log.info("worker.already_answered", attempt=attempt)
                return
            log.info(
                "worker.done",
                status=outcome.status,
                tokens=outcome.usage.completion_tokens,
                total=round(outcome.timings.total, 4),
            )

    async def _run(self, req: GenerateRequest, writer: TokenStreamWriter | None) -> Outcome:
        now = time.time()
        since = req.admitted_at or req.created_at
        if req.id in self.cancelled:
            return _refusal("cancelled", "cancelled", "cancelled before it started", since, now)
        if req.expired(now):
            late = now - (req.deadline or now)
            return _refusal("expired", "expired", f"deadline passed {late:.3f}s ago", since, now)
        age = req.frame_age(now)
        if req.stale_after is not None and age is not None and age > req.stale_after:
            return _refusal(
                "stale", "stale", f"frame is {age:.3f}s old, budget {req.stale_after:.3f}s",
                since, now,
            )  # fmt: skip
        started = time.time()
        metrics.QUEUE.labels(self.engine.kind).observe(max(0.0, started - since))
        first: float | None = None
        last = started
        text: list[str] = []
        usage = Usage()
        finish: FinishReason | None = None
        self.running.add(req.id)
        # The engine stops at the deadline whether or not it checks deadlines itself.
        remaining = req.remaining()
        watchdog = (
            asyncio.get_running_loop().call_later(
                max(0.0, remaining), lambda: asyncio.ensure_future(self.engine.abort(req.id))
            )
            if remaining is not None
            else None
        )
        try:
            async for delta in self.engine.generate(EngineRequest.from_generate(req)):
                last = time.time()
                if delta.text:
                    first = first or last
                    text.append(delta.text)
                    if writer is not None and req.stream:
                        await writer.delta(delta.text, delta.completion_tokens)
                usage = Usage(
                    prompt_tokens=delta.prompt_tokens or usage.prompt_tokens,
                    completion_tokens=delta.completion_tokens,
                    cached_tokens=delta.cached_tokens or usage.cached_tokens,
                )
                finish = delta.finish_reason or finish
        except SwitchyardError as exc:
            log.warning("worker.engine_refused", code=exc.code, reason=exc.reason)
            status: ResultStatus = "expired" if exc.code == "expired" else "error"
            return _refusal(status, exc.code, exc.reason, since, time.time())
        finally:
            self.running.discard(req.id)
            if watchdog is not None:
                watchdog.cancel()
        timings = _timings(since, started, first, last, usage.completion_tokens)
        timings = timings.model_copy(
            update={"router": _router_wait(req), "modelled": self._modelled(req.id)}
        )
        if timings.ttft is not None:
            metrics.TTFT.labels(self.engine.kind).observe(timings.ttft)
        if timings.tpot is not None:
            metrics.TPOT.labels(self.engine.kind).observe(timings.tpot)
        tenant = metrics.TENANTS(req.tenant)
        metrics.TOKENS_IN.labels(tenant).inc(usage.prompt_tokens)
        metrics.TOKENS_OUT.labels(tenant).inc(usage.completion_tokens)
        if finish == "abort":
            reason = "cancelled" if req.id in self.cancelled else "aborted"
            return Outcome(
                "cancelled" if reason == "cancelled" else "expired",
                "".join(text), finish, usage, timings,
                ErrorInfo(code="cancelled" if reason == "cancelled" else "expired", reason=reason),
                started, first,
            )  # fmt: skip
        answer_text = "".join(text)
        if req.frame_geometry is not None:
            # The model saw the resized frame; the phone acts on its own pixels.
            answer_text = answer_to_original(answer_text, Geometry.of(req.frame_geometry))
        return Outcome("ok", answer_text, finish, usage, timings, None, started, first)

    def _modelled(self, request_id: str) -> ModelledTimings | None:
        """The sim engine's modelled cost of a finished request (other engines have none)."""
        if not isinstance(self.engine, SimEngine):
            return None
        t = self.engine.timings(request_id)
        if t is None:
            return None
        return ModelledTimings(
            queue=t.queue, prefill=t.prefill,
            decode=max(0.0, t.total - t.queue - t.prefill), total=t.total,
        )  # fmt: skip


def _refusal(
    status: ResultStatus, code: ErrorCode, reason: str, since: float, now: float
) -> Outcome:
    return Outcome(
        status,
        finish_reason="abort" if status in ("cancelled", "expired", "stale") else "error",
        timings=Timings(queue=max(0.0, now - since), total=max(0.0, now - since)),
        error=ErrorInfo(code=code, reason=reason),
    )


def _router_wait(req: GenerateRequest) -> float | None:
    if req.admitted_at is None or req.dispatched_at is None:
        return None
    return max(0.0, req.dispatched_at - req.admitted_at)


def _timings(since: float, started: float, first: float | None, last: float, n: int) -> Timings:
    return Timings(
        queue=max(0.0, started - since),
        ttft=None if first is None else first - started,
        tpot=None if first is None or n < 2 else (last - first) / (n - 1),
        total=max(0.0, last - since),
    )
