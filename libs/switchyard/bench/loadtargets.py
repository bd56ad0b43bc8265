"""Where a load test sends its requests: straight onto NATS, or through the HTTP edge.

Both record the same things for the runner (`loadgen.Record`): when the request left,
when its first token (or, for a question, its first stage event) arrived, each
streamed chunk, when the answer or error arrived, the outcome class and the token
counts the fleet reported. Agent steps through the edge are not streamed (the edge
answers a step as one JSON body), so their TTFT is their end-to-end latency.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import httpx

from switchyard import subjects
from switchyard.bench.loadgen import Clock, Record, error_class
from switchyard.bench.workloads import RequestSpec
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.errors import StreamTimeout
from switchyard.messages.agent import AgentStep, RawFrame, StepOptions
from switchyard.messages.inference import ChatMessage, ChatRequest, GenerateResult, Sampling
from switchyard.messages.sql import SqlAnswer, SqlAsk, StageProgress
from switchyard.text2sql.client import stream_answer


def _finish_result(rec: Record, result: GenerateResult | None, clock: Clock) -> None:
    rec.finish = clock.now()
    if result is None:
        rec.outcome, rec.detail = "error", "the stream ended without a result"
        return
    rec.input_tokens = result.usage.prompt_tokens
    rec.output_tokens = result.usage.completion_tokens or rec.output_tokens
    if result.status == "ok":
        rec.outcome = "ok"
        return
    code = result.error.code if result.error else result.status
    rec.outcome = error_class(code)
    rec.detail = result.error.reason[:200] if result.error else result.status


class NatsTarget:
    """Publishes on `llm.in`/`agent.in`/`sql.in.<tenant>` and reads the reply inbox."""

    def __init__(self, bus: Bus, *, idle_timeout: float = 120.0) -> None:
        self.bus = bus
        self.idle_timeout = idle_timeout

    async def send(self, spec: RequestSpec, rec: Record, clock: Clock) -> None:
        if spec.kind == "sql":
            await self._sql(spec, rec, clock)
            return
        msg: ChatRequest | AgentStep
        if spec.kind == "chat":
            msg = ChatRequest(
                tenant=spec.tenant,
                messages=[ChatMessage(role=r, content=c) for r, c in spec.messages],  # type: ignore[arg-type]
                sampling=Sampling(max_tokens=spec.max_tokens, temperature=0.0),
                stream=True, deadline=time.time() + self.idle_timeout,
                session=spec.session or None,
            )  # fmt: skip
            subject = subjects.llm_in(spec.tenant)
        else:
            msg = _agent_step(spec, clock.wall(rec.intended))
            subject = subjects.agent_in(spec.tenant)
        try:
            async with TokenStreamReader(self.bus.nc, idle_timeout=self.idle_timeout) as reader:
                rec.sent = clock.now()
                await publish(self.bus.js, subject, msg.model_copy(update={"reply": reader.inbox}))
                async for frame in reader:
                    now = clock.now()
                    if frame.type == "delta":
                        rec.arrived(now)
                        rec.output_tokens += frame.tokens
                    elif frame.type == "end":
                        _finish_result(rec, frame.result, clock)
                    else:
                        rec.finish = now
                        rec.outcome = error_class(frame.error.code if frame.error else None)
                        rec.detail = frame.error.reason[:200] if frame.error else "error frame"
        except StreamTimeout as exc:
            rec.finish, rec.outcome, rec.detail = clock.now(), "client_timeout", str(exc)[:200]

    async def _sql(self, spec: RequestSpec, rec: Record, clock: Clock) -> None:
        ask = SqlAsk(tenant=spec.tenant, question=spec.question,
                     deadline=time.time() + self.idle_timeout)  # fmt: skip
        rec.sent = clock.now()
        try:
            async for item in stream_answer(self.bus, ask, idle_timeout=self.idle_timeout):
                now = clock.now()
                if isinstance(item, SqlAnswer):
                    rec.finish = now
                    _sql_outcome(rec, item.status, item.error.code if item.error else None)
                    return
                if isinstance(item, StageProgress):
                    continue  # a keepalive: no stage, not the stream's progress
                rec.arrived(now)
        except StreamTimeout as exc:
            rec.finish, rec.outcome, rec.detail = clock.now(), "client_timeout", str(exc)[:200]


def _sql_outcome(rec: Record, status: str, code: str | None) -> None:
    # A clarifying question is an answer the analyst gets; a rejection or error is not.
    if status in ("ok", "clarify"):
        rec.outcome = "ok"
    else:
        rec.outcome = error_class(code or status)
        rec.detail = status


def _agent_step(spec: RequestSpec, frame_ts: float) -> AgentStep:
    # The frame was captured when the step was due: a late send shows up as a stale frame.
    return AgentStep(
        tenant=spec.tenant, session=spec.session, step=spec.step, frame_ts=frame_ts,
        frames=[RawFrame(data=f, mime="image/jpeg") for f in spec.frames],
        goal=spec.goal, history=list(spec.history), stale_after=spec.stale_after,
        options=StepOptions(max_tokens=spec.max_tokens),
    )  # fmt: skip


def _http_error(status: int, body: bytes) -> tuple[str, str]:
    code: str | None = None
    message = body[:200].decode(errors="replace")
    try:
        err = json.loads(body).get("error", {})
        code, message = err.get("code"), str(err.get("message", message))[:200]
    except (ValueError, AttributeError):
        pass
    return error_class(code, status), message


class EdgeTarget:
    """`POST /v1/chat/completions` (SSE), `/v1/agent/step`, `/v1/sql/ask` (SSE)."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def send(self, spec: RequestSpec, rec: Record, clock: Clock) -> None:
        if spec.kind == "agent":
            await self._agent(spec, rec, clock)
            return
        if spec.kind == "chat":
            path = "/v1/chat/completions"
            body: dict[str, Any] = {
                "model": "default", "max_tokens": spec.max_tokens, "temperature": 0,
                "messages": [{"role": r, "content": c} for r, c in spec.messages],
                "stream": True, "stream_options": {"include_usage": True},
                "user": spec.session or None,
            }  # fmt: skip
        else:
            path, body = "/v1/sql/ask", {"question": spec.question, "stream": True}
        rec.sent = clock.now()
        async with self.http.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                rec.finish = clock.now()
                rec.outcome, rec.detail = _http_error(r.status_code, await r.aread())
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue  # blank separators and heartbeats (SSE comments)
                data = line[6:]
                now = clock.now()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                self._event(spec, rec, event, now)
        rec.finish = clock.now()
        if rec.outcome == "pending":
            rec.outcome, rec.detail = "error", "the stream ended without an answer"
        if rec.ok and not rec.output_tokens:
            rec.output_tokens = len(rec.token_times)

    @staticmethod
    def _event(spec: RequestSpec, rec: Record, event: dict[str, Any], now: float) -> None:
        if event.get("type") != "answer" and (event.get("error") or event.get("type") == "error"):
            err = event.get("error") or event
            rec.outcome = error_class(err.get("code"))
            rec.detail = str(err.get("message", ""))[:200]
            return
        if spec.kind == "sql":
            rec.arrived(now)
            if event.get("type") == "answer":
                status = str(event.get("status", "error"))
                code = (event.get("error") or {}).get("code")
                _sql_outcome(rec, status, code)
            return
        if event.get("usage"):
            rec.input_tokens = int(event["usage"].get("prompt_tokens", 0))
            rec.output_tokens = int(event["usage"].get("completion_tokens", 0))
        for choice in event.get("choices", []):
            if choice.get("delta", {}).get("content"):
                rec.arrived(now)
            if choice.get("finish_reason"):
                rec.outcome = "ok"

    async def _agent(self, spec: RequestSpec, rec: Record, clock: Clock) -> None:
        body = {
            "session": spec.session, "step": spec.step, "frame_ts": clock.wall(rec.intended),
            "stale_after": spec.stale_after, "goal": spec.goal, "history": list(spec.history),
            "options": {"max_tokens": spec.max_tokens},
            "frames": [{"data": base64.b64encode(f).decode(), "mime": "image/jpeg"}
                       for f in spec.frames],
        }  # fmt: skip
        rec.sent = clock.now()
        r = await self.http.post("/v1/agent/step", json=body)
        rec.finish = clock.now()
        if r.status_code != 200:
            rec.outcome, rec.detail = _http_error(r.status_code, r.content)
            return
        usage = r.json().get("usage", {})
        rec.input_tokens = int(usage.get("prompt_tokens", 0))
        rec.output_tokens = int(usage.get("completion_tokens", 0))
        rec.outcome = "ok"
