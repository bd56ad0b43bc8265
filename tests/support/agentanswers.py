"""The worker's mapping of an answer before it was parsed once (issue 37): the oracle that
the output step (`services/worker/output.py`) writes every answer's text as it did."""

from __future__ import annotations

import json
from typing import Any

from switchyard.agentactions import Answer, encode_answer, parse_answer_text
from switchyard.agentprompt import Geometry
from switchyard.messages.agent import Action, ActionFormat

_POINTS = (("x", "y"), ("x1", "y1"), ("x2", "y2"))


def old_mapping(text: str, g: Geometry, fmt: ActionFormat) -> str:
    """`agentprompt.answer_to_original` as it was: compact parsed, moved and written again;
    JSON loaded, its points patched in place, dumped compactly."""
    if fmt == "compact":
        answer = parse_answer_text(text, "compact")
        moved = tuple(_moved(a, g) for a in answer.actions)
        return encode_answer(Answer(moved, answer.thought), "compact")
    obj: Any = json.loads(text)
    for action in obj.get("actions", [obj]):
        for kx, ky in _POINTS:
            if kx in action and ky in action:
                action[kx], action[ky] = g.to_original(action[kx], action[ky])
    return json.dumps(obj, separators=(",", ":"))


def _moved(a: Action, g: Geometry) -> Action:
    values = a.model_dump()
    for kx, ky in _POINTS:
        if kx in values:
            values[kx], values[ky] = g.to_original(values[kx], values[ky])
    moved: Action = type(a).model_validate(values)
    return moved
