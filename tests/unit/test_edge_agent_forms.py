"""The edge's two encodings of an agent step read the same fields, repeated lists included."""

from __future__ import annotations

import base64
import json

import httpx
import pytest

from services.edge.agent import parse_json, parse_multipart
from services.edge.errors import ApiError

pytestmark = pytest.mark.unit

FIELDS = {"session": "ep-1", "frame_ts": "1700000000.5", "step": "3", "goal": "win"}


def _form(pairs: list[tuple[str, str]]) -> tuple[str, bytes]:
    req = httpx.Request(
        "POST", "http://edge/v1/agent/step", data=FIELDS,
        files=[("frames", ("f.png", b"\x89PNG", "image/png")),
               *[(name, (None, value)) for name, value in pairs]],  # type: ignore[list-item]
    )  # fmt: skip
    return req.headers["content-type"], req.read()


def test_history_and_pending_repeat_in_a_form_as_lists_in_order() -> None:
    ctype, raw = _form([("history", "back"), ("pending", "click 1 2"), ("history", "done"),
                        ("pending", "wait 500")])  # fmt: skip
    step = parse_multipart(ctype, raw)
    assert step.fields.history == ["back", "done"]
    assert step.fields.pending == ["click 1 2", "wait 500"]
    assert step.fields.step == 3 and step.frames == [(b"\x89PNG", "image/png")]
    # The JSON encoding takes the same lists.
    body = {**FIELDS, "frame_ts": 1700000000.5, "step": 3, "pending": ["click 1 2"],
            "frames": [{"data": base64.b64encode(b"\x89PNG").decode()}]}  # fmt: skip
    assert parse_json(json.dumps(body).encode()).fields.pending == ["click 1 2"]


def test_more_pending_actions_than_a_chunk_holds_are_a_typed_error() -> None:
    ctype, raw = _form([("pending", "back")] * 6)  # a chunk is at most 5 actions
    with pytest.raises(ApiError) as err:
        parse_multipart(ctype, raw)
    assert err.value.status == 422 and err.value.param == "pending"
