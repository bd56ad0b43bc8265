"""Runs one `GenerateRequest` on the engine and answers it exactly once.

The answer goes to `RES` first (deduplicated by `res-<request id>`, so a
redelivered request that an earlier attempt already answered is not answered
again), then as the end frame of the token stream, then the WORK message is
acked by the pull loop. A request cancelled, superseded by a newer step of its
agent session, stale or past its deadline (`switchyard.requestpolicy`, the
router's verdict too) is answered without touching the engine. The newest step
per session comes from the routers' `NewestStep` notices (`observe`) and from the
requests this worker pulls itself. A step handed to the engine but not yet begun
there (no token out: waiting for a slot, or in prefill) is aborted for a newer step
and answered `superseded` too - its screen is gone and the GPU time is the newer
step's. A step already producing tokens is left to finish (its action may still be
of use); but an answer that is ready only after its frame outlived its budget is
answered `stale`, its text withheld, so a phone never acts on a screen that is gone.
Nor on part of an action: an agent step's text goes through the output step
(`output.py`: parsed once, cut or whole, mapped to the phone's pixels); a cut answer
is answered `error` with code `answer_cut` (and counted), a whole one carries its
`actions` and `thought` on the result.

When the engine dies (`EngineDead`: vLLM's engine core is gone), the worker is told
(`on_engine_dead`, once) and every request it holds or pulls after that is settled
without the engine: one that has streamed a token to its client is answered `error`
(code `engine_error`, the engine died mid-answer); any other is handed back
(`TransientError`: the pull loop naks it) for the worker its partition moves to.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from nats.js import JetStreamContext

from services.worker import metrics
from services.worker.enginetime import EngineTime
from services.worker.output import Cut, agent_answer
from switchyard import otel, subjects
from switchyard.agentactions import Answer
from switchyard.answers import answer, result_for, route_of
from switchyard.bus.publish import FAILOVER_PATIENCE, publish
from switchyard.bus.tokenstream import TokenStreamWriter
from switchyard.engines.base import Engine, EngineDead, EngineRequest, ModelsCost
from switchyard.errors import SwitchyardError, TransientError
from switchyard.logging import bind_request, get_logger
from switchyard.messages.inference import (
    ActionsConstraint,
    ErrorInfo,
    FinishReason,
    GenerateRequest,
    KvHandoff,
    ModelledTimings,
    Phase,
    ResultStatus,
    Timings,
    Usage,
)
from switchyard.requestpolicy import (
    NewestSteps,
    Refusal,
    Tombstones,
    staleness,
    superseded_by,
    verdict,
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
    answer: Answer | None = None  # an agent step's whole answer (`output.agent_answer`)
    kv_params: dict[str, Any] | None = None  # a prefill stage's, for its decode stage
    engine_queue: float | None = None  # an answer's `Delta.queued`: the engine's wait


class Runner:
    def __init__(
        self, nc: Client, js: JetStreamContext, engine: Engine, worker_id: str,
        on_engine_dead: Callable[[EngineDead], None] | None = None,
    ) -> None:  # fmt: skip
        self.nc = nc
        self.js = js
        self.engine = engine
        # Asked once: isinstance against a runtime Protocol costs ~20 us a call.
        self.cost_model = engine if isinstance(engine, ModelsCost) else None
        self.worker_id = worker_id
        self.tracer = otel.tracer("worker")
        self.on_engine_dead = on_engine_dead
        self.dead: EngineDead | None = None  # the engine's death, once seen
        self.running: set[str] = set()
        self.engine_time = EngineTime()  # each request's share, its GPU-seconds
        self.handling: dict[str, asyncio.Future[None]] = {}  # request id -> done, per delivery
        # Agent steps on the engine that have not produced a token yet, per session
        # (tenant, session) -> {request id: step}: every router's notice looks one up.
        self.unbegun: dict[tuple[str, str], dict[str, int]] = {}
        self.superseded: set[str] = set()  # ... of those, aborted for a newer step
        self.aborting: set[asyncio.Future[None]] = set()
        self.cancelled = Tombstones()
        self.newest = NewestSteps()
        # The engine's last sign of life (monotonic): a delta, a request leaving it, or
        # work reaching it idle. `stalled_for` reads it from the probes' thread.
        self.progress_at = time.monotonic()

    def stalled_for(self) -> float:
        """Seconds the engine has held requests without a delta or an end; 0 when idle."""
        return time.monotonic() - self.progress_at if self.running else 0.0

    def observe(self, tenant: str, session: str, step: int) -> None:
        """A router admitted `step` of the session: its older steps not started here are
        answered `superseded` when their turn comes, and those on the engine that have
        not begun are aborted now."""
        self.newest.see(tenant, session, step)
        self._supersede_unbegun(tenant, session, step)

    def _supersede_unbegun(self, tenant: str, session: str, step: int) -> None:
        waiting = self.unbegun.get((tenant, session), {})
        for rid in [rid for rid, older in waiting.items() if older < step]:
            self.superseded.add(rid)
            del waiting[rid]
            task = asyncio.ensure_future(self.engine.abort(rid))
            self.aborting.add(task)  # held until done: the loop keeps weak references
            task.add_done_callback(self.aborting.discard)

    def _begun(self, req: GenerateRequest) -> None:
        """`req` produced its first token (or left the engine): no newer step aborts it."""
        if req.session is None:
            return
        key = (req.tenant, req.session)
        waiting = self.unbegun.get(key)
        if waiting is not None:
            waiting.pop(req.id, None)
            if not waiting:
                del self.unbegun[key]

    async def cancel(self, request_id: str) -> None:
        self.cancelled.add(request_id)
        if request_id in self.running:
            await self.engine.abort(request_id)

    async def handle(self, req: GenerateRequest, attempt: int = 1) -> None:
        first = self.handling.get(req.id)
        if first is not None:
            # Delivered again while it runs here (its keepalive came late, past WORK's short
            # ack wait): the first run answers; this delivery is settled when it has.
            await asyncio.shield(first)
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.handling[req.id] = done
        try:
            await self._handle(req, attempt)
        finally:
            del self.handling[req.id]
            done.set_result(None)

    async def _handle(self, req: GenerateRequest, attempt: int) -> None:
        # The worker's span runs from the WORK publish (the router's stamp), so its queue
        # stage is the wait in WORK and for an engine slot; its stages are laid out from
        # the same stamps the result's route carries (what `sy trace` shows).
        with (
            bind_request(req.id, req.tenant, req.trace),
            self.tracer.hop("worker", req.trace, start=req.dispatched_at, worker=self.worker_id,
                            stage=req.stage, attempt=attempt) as hop,
        ):  # fmt: skip
            # A prefill stage streams nothing: its one token is the decode stage's to send.
            reply = req.reply if req.stage != "prefill" else None
            writer = TokenStreamWriter(self.nc, reply, attempt=attempt) if reply else None
            outcome = await self._run(req, writer)
            route = route_of(req, time.time(), outcome.started_at, outcome.first_token_at)
            hop.child("worker.queue", req.dispatched_at, route.started_at)
            hop.child("worker.prefill", route.started_at, route.first_token_at)
            hop.child("worker.decode", route.first_token_at, route.finished_at)
            if outcome.status in otel.FAILED:
                error = outcome.error
                hop.fail(error.code if error else outcome.status, error.reason if error else "")
            if req.stage == "prefill" and outcome.status == "ok":
                await self._hand_off(req.model_copy(update={"trace": hop.traceparent}), outcome)
                return
            result = result_for(
                req,
                outcome.status,
                outcome.error,
                text=outcome.text,
                finish_reason=outcome.finish_reason,
                usage=outcome.usage,
                timings=outcome.timings,
                worker=self.worker_id,
                route=route,
                actions=None if outcome.answer is None else list(outcome.answer.actions),
                thought=None if outcome.answer is None else outcome.answer.thought,
            )
            metrics.RESULTS.labels(outcome.status).inc()
            phases = route.phases(outcome.engine_queue)
            if outcome.status == "ok":
                metrics.observe_answer(route, req.workload, phases)
            if not await answer(self.nc, self.js, result, req.reply, writer):
                log.info("worker.already_answered", attempt=attempt)
                return
            self._log_done(req, outcome, phases)

    def _log_done(self, req: GenerateRequest, outcome: Outcome, phases: dict[Phase, float]) -> None:
        """The one line per finished request: what ran, how, and where its time went;
        never its prompt or its answer."""
        model, sampling, usage = self.engine.model, req.sampling, outcome.usage
        log.info(
            "worker.done",
            status=outcome.status, finish_reason=outcome.finish_reason,
            error=None if outcome.error is None else outcome.error.code,
            pool=req.pool, workload=req.workload, stage=req.stage,
            model=model.name, model_version=model.version, lora=req.lora,
            temperature=sampling.temperature, top_p=sampling.top_p,
            max_tokens=sampling.max_tokens, seed=sampling.seed, stops=len(sampling.stop),
            constraint=req.constraint.type, prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens, cached_tokens=usage.cached_tokens,
            total=round(outcome.timings.total, 4),
            phases={k: round(v, 4) for k, v in phases.items()},
        )  # fmt: skip

    async def _hand_off(self, req: GenerateRequest, outcome: Outcome) -> None:
        """The prefill stage ran (#39): its decode stage goes back on REQ for the router to
        place on a decode worker, with where the KV is. Stored before WORK is acked, under
        one id per request (a prefill run again after a crash hands off once); a publish
        that fails raises, so WORK redelivers and the prefill runs again."""
        usage = outcome.usage
        handoff = KvHandoff(
            worker=self.worker_id, tokens=max(0, usage.prompt_tokens - usage.cached_tokens),
            prefilled_at=time.time(), params=outcome.kv_params or {},
        )  # fmt: skip
        decode = req.model_copy(
            update={"stage": "decode", "handoff": handoff, "dispatched_at": None,
                    "partition": None, "routed_to": None}
        )  # fmt: skip
        await publish(
            self.js, subjects.req(req.workload, req.tenant), decode,
            msg_id=f"{req.id}.decode", patience=FAILOVER_PATIENCE,
        )  # fmt: skip
        metrics.HANDOFFS.inc()
        log.info("worker.handed_off", tokens=handoff.tokens)

    async def _run(self, req: GenerateRequest, writer: TokenStreamWriter | None) -> Outcome:
        now = time.time()
        since = req.admitted_at or req.created_at
        if self.newest.see_request(req) and req.session is not None and req.step is not None:
            self._supersede_unbegun(req.tenant, req.session, req.step)
        refusal = verdict(
            req, now, cancelled=req.id in self.cancelled, newest=self.newest.newest(req),
            where="before it started",
        )  # fmt: skip
        if refusal is not None:
            return _refused(refusal, since, now)
        if self.dead is not None:
            raise _handed_back(self.dead)
        started = time.time()
        metrics.QUEUE.labels(self.engine.kind).observe(max(0.0, started - since))
        first: float | None = None
        last = previous = started  # the latest delta, and the latest carrying text
        engine_queue: float | None = None
        text: list[str] = []
        usage = Usage()
        finish: FinishReason | None = None
        if not self.running:  # an idle engine's stall is counted from its first request
            self.progress_at = time.monotonic()
        self.running.add(req.id)
        if req.session is not None and req.step is not None:
            self.unbegun.setdefault((req.tenant, req.session), {})[req.id] = req.step
        # The engine stops at the deadline whether or not it checks deadlines itself.
        remaining = req.remaining()
        watchdog = (
            asyncio.get_running_loop().call_later(
                max(0.0, remaining), lambda: asyncio.ensure_future(self.engine.abort(req.id))
            )
            if remaining is not None
            else None
        )
        engine_req = EngineRequest.from_generate(req)
        if req.stage == "prefill":  # the prompt's KV and one token, for the decode stage
            one = req.sampling.model_copy(update={"max_tokens": 1})
            engine_req = dataclasses.replace(engine_req, sampling=one, kv_producer=True)
        kv_params: dict[str, Any] | None = None
        held_from = self.engine_time.start(started)
        decode_from: float | None = None
        try:
            async for delta in self.engine.generate(engine_req):
                last = time.time()
                self.progress_at = time.monotonic()
                kv_params = delta.kv_transfer_params or kv_params
                if delta.text:
                    if first is None:
                        first, engine_queue = last, delta.queued
                        decode_from = self.engine_time.mark(first)
                        self._begun(req)
                    else:
                        metrics.ITL.labels(req.pool).observe(last - previous)
                    previous = last
                    text.append(delta.text)
                    if writer is not None and req.stream:
                        fresh = delta.completion_tokens - usage.completion_tokens
                        await writer.delta(delta.text, max(0, fresh))
                usage = Usage(
                    prompt_tokens=delta.prompt_tokens or usage.prompt_tokens,
                    completion_tokens=delta.completion_tokens,
                    cached_tokens=delta.cached_tokens or usage.cached_tokens,
                )
                finish = delta.finish_reason or finish
        except EngineDead as exc:
            self._engine_died(exc)
            if first is None or writer is None or not req.stream:
                raise _handed_back(exc) from exc  # its client has seen nothing yet
            why = f"the engine died mid-answer ({usage.completion_tokens} tokens): {exc.reason}"
            return _refused(Refusal("error", "engine_error", why), since, time.time())
        except SwitchyardError as exc:
            log.warning("worker.engine_refused", code=exc.code, reason=exc.reason)
            status: ResultStatus = "expired" if exc.code == "expired" else "error"
            return _refused(Refusal(status, exc.code, exc.reason), since, time.time())
        finally:
            self.running.discard(req.id)
            held_to = self.engine_time.finish(time.time())
            self.progress_at = time.monotonic()
            self._begun(req)
            superseded = req.id in self.superseded
            self.superseded.discard(req.id)
            if watchdog is not None:
                watchdog.cancel()
        timings = _timings(since, started, first, last, usage.completion_tokens)
        timings = timings.model_copy(
            update={"router": _router_wait(req), "modelled": self._modelled(req.id)}
        )
        if timings.ttft is not None:
            metrics.TTFT.labels(self.engine.kind).observe(timings.ttft)
        if timings.tpot is not None:
            metrics.TPOT.labels(req.pool, self.engine.kind).observe(timings.tpot)
        tenant, pool = metrics.TENANTS(req.tenant), req.pool
        metrics.ENGINE_REQUESTS.labels(tenant, pool).inc()
        metrics.TOKENS_IN.labels(tenant, pool).inc(usage.prompt_tokens)
        metrics.TOKENS_OUT.labels(tenant, pool).inc(usage.completion_tokens)
        prefill_to = held_to if decode_from is None else decode_from
        metrics.GPU_SECONDS.labels(tenant, pool, "prefill").inc(prefill_to - held_from)
        metrics.GPU_SECONDS.labels(tenant, pool, "decode").inc(held_to - prefill_to)
        if superseded:
            gave_way = superseded_by(
                req, self.newest.newest(req), "on the engine, before it produced a token"
            )
            error = gave_way.error
            return Outcome("superseded", "", "abort", usage, timings, error, started, first)
        if finish == "abort":
            reason = "cancelled" if req.id in self.cancelled else "aborted"
            return Outcome(
                "cancelled" if reason == "cancelled" else "expired",
                "".join(text), finish, usage, timings,
                ErrorInfo(code="cancelled" if reason == "cancelled" else "expired", reason=reason),
                started, first,
            )  # fmt: skip
        late = staleness(req, time.time(), where="when its answer was ready")
        if late is not None:
            metrics.LATE.inc()
            return Outcome("stale", "", finish, usage, timings, late.error, started, first)
        answer_text = "".join(text)
        if req.stage == "prefill":
            ok = Outcome("ok", "", finish, usage, timings, None, started, first)
            ok.kv_params = kv_params
            return ok
        if not isinstance(req.constraint, ActionsConstraint):
            ok = Outcome("ok", answer_text, finish, usage, timings, None, started, first)
            ok.engine_queue = engine_queue
            return ok
        out = agent_answer(answer_text, finish, req.constraint, req.frame_geometry)
        if isinstance(out, Cut):
            # Never a partial action to a phone: the client gets a typed error.
            metrics.ANSWERS_CUT.labels(req.constraint.action_format, out.reason).inc()
            log.warning("worker.answer_cut", reason=out.reason, max_tokens=req.sampling.max_tokens,
                        tokens=usage.completion_tokens)  # fmt: skip
            error = ErrorInfo(code="answer_cut", reason=out.detail)
            return Outcome("error", answer_text, finish, usage, timings, error, started, first)
        ok = Outcome("ok", out.text, finish, usage, timings, None, started, first, out.answer)
        ok.engine_queue = engine_queue
        return ok

    def _engine_died(self, exc: EngineDead) -> None:
        if self.dead is not None:
            return
        self.dead = exc
        if self.on_engine_dead is not None:
            self.on_engine_dead(exc)

    def _modelled(self, request_id: str) -> ModelledTimings | None:
        """The engine's modelled cost of a finished request, if it models one (`sim`)."""
        if self.cost_model is None:
            return None
        return self.cost_model.modelled_timings(request_id)


def _handed_back(dead: EngineDead) -> TransientError:
    """What a request the dead engine had not begun raises: the pull loop naks it."""
    return TransientError(f"handed back, the engine died: {dead.reason}", code="engine_error")


def _refused(refusal: Refusal, since: float, now: float) -> Outcome:
    status = refusal.status
    aborted = status in ("cancelled", "expired", "stale", "superseded")  # not failures
    return Outcome(
        status,
        finish_reason="abort" if aborted else "error",
        timings=Timings(queue=max(0.0, now - since), total=max(0.0, now - since)),
        error=refusal.error,
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
