"""How the edge renders a question's reply items as SSE: a stage, and sqlflow's keepalive
(a `progress` event, never a `stage`: clients listing stages must not count it)."""

from __future__ import annotations

import json

from services.edge.sql import SqlStream
from switchyard.messages.inference import TokenFrame
from switchyard.messages.sql import StageEvent, StageProgress


def parsed(said: str | None) -> object:
    assert said is not None and said.startswith("data: ") and said.endswith("\n\n"), said
    return json.loads(said.removeprefix("data: "))


def test_a_keepalive_is_a_progress_event_and_a_stage_a_stage() -> None:
    render = SqlStream()
    beat = StageProgress(tenant="acme", request_id="r1", stage="sql", seconds=4.5,
                         elapsed=9.25, tokens=12)  # fmt: skip
    stage = StageEvent(tenant="acme", request_id="r1", stage="scope", seconds=0.5,
                       data={"mode": "full"})  # fmt: skip
    assert parsed(render.progress(beat)) == {
        "type": "progress", "stage": "sql", "seconds": 4.5, "elapsed": 9.25, "tokens": 12,
    }  # fmt: skip
    between = StageProgress(tenant="acme", request_id="r1")  # between stages, no model call
    assert parsed(render.progress(between)) == {
        "type": "progress", "stage": None, "seconds": 0.0, "elapsed": 0.0, "tokens": None,
    }  # fmt: skip
    assert parsed(render.progress(stage)) == {
        "type": "stage", "stage": "scope", "seconds": 0.5, "data": {"mode": "full"},
    }  # fmt: skip
    # a token frame is no part of a question's stream
    assert render.progress(TokenFrame(seq=0, type="delta", text="x")) is None
