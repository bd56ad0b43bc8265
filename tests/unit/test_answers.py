"""The results the router, the worker and the preprocessor answer with."""

from __future__ import annotations

import time

import pytest

from switchyard.answers import refusal_for, result_for
from switchyard.envelope import Envelope
from switchyard.messages.agent import AgentStep, RawFrame
from switchyard.messages.inference import ChatMessage, ErrorInfo, GenerateRequest


def test_result_for_a_request_carries_its_envelope_route_and_queue_time() -> None:
    now = time.time()
    req = GenerateRequest(
        tenant="acme", workload="llm", pool="llm", session="s1", frame_ts=now - 3,
        created_at=now - 2, admitted_at=now - 1, partition=3, routed_to="w0",
        messages=[ChatMessage(role="user", content="hi")],
    )  # fmt: skip
    result = result_for(req, "expired", ErrorInfo(code="expired", reason="late"))
    assert (result.request_id, result.tenant, result.workload) == (req.id, "acme", "llm")
    assert (result.session, result.frame_ts, result.trace) == (req.session, req.frame_ts, req.trace)
    assert result.finish_reason == "abort"
    assert result.timings.queue == pytest.approx(1.0, abs=0.5)  # since admission
    assert result.route is not None
    assert (result.route.pool, result.route.partition, result.route.routed_to) == ("llm", 3, "w0")
    ok = result_for(req, "ok", text="done", finish_reason="stop")
    assert (ok.text, ok.finish_reason, ok.error) == ("done", "stop", None)


def test_refusal_for_a_step_that_never_became_a_request() -> None:
    now = time.time()
    step = AgentStep(
        tenant="acme", session="ep-1", frame_ts=now - 5, created_at=now - 4,
        reply="_INBOX.x", frames=[RawFrame(data=b"not a png")],
    )  # fmt: skip
    error = ErrorInfo(code="stale", reason="old")
    result = refusal_for(step, "agent", "agent", "stale", error)
    assert (result.request_id, result.tenant, result.workload) == (step.id, "acme", "agent")
    assert (result.session, result.frame_ts, result.trace) == ("ep-1", step.frame_ts, step.trace)
    assert (result.status, result.error, result.finish_reason) == ("stale", error, "abort")
    assert result.timings.queue == pytest.approx(4.0, abs=0.5)  # since it was created
    route = result.route
    assert route is not None and (route.pool, route.partition) == ("agent", None)
    assert route.created_at == step.created_at and route.admitted_at is None
    # A bare envelope (all that could be read of a broken step) is enough.
    bare = Envelope(kind="agent.step", tenant="acme", reply="_INBOX.y")
    rejected = refusal_for(bare, "agent", "agent", "rejected", ErrorInfo(code="schema", reason="x"))
    assert (rejected.request_id, rejected.finish_reason) == (bare.id, None)
