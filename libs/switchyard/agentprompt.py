"""The agent step's prompt layout and frame geometry, shared by the preprocessor and clients.

    [system][text action history][previous frame][current frame][query]

The system prompt is byte-identical for every step of every episode and the
history only grows at its end, so step k+1 starts with everything of step k up
to the end of step k's history. Actions enter the prompt as text (a few tokens
each), never as old frames (about a thousand tokens each).

A known limit of this layout (measured by `sy agent-sim`): the previous frame
sits *after* a history that grew by one line, so its KV position changed and a
positional prefix cache cannot serve it. What its stable hash still saves is
the vision encoder's work (vLLM caches encoder outputs by multimodal uuid).

Geometry lives here too because both sides need it: the preprocessor resizes
with `fit`, and whoever executes an action maps its coordinates back with
`Geometry.to_original`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from switchyard.messages.agent import AgentStep, parse_answer
from switchyard.messages.inference import ChatMessage, FrameGeometry, Image, ImagePart, TextPart

# Qwen2.5-VL: 14 px patches merged 2x2, so one visual token per 28x28 square.
PATCH_PX = 28

SYSTEM_PROMPT = (
    "You are an agent that plays a mobile game on a cloud phone. Each step you see "
    "the previous and the current screenshot and the actions taken so far. Answer "
    "with the next action as compact JSON and nothing else: click x,y; long_press "
    "x,y,ms; swipe x1,y1,x2,y2,ms; type text; back; wait ms; done. Coordinates are "
    "pixels of the current screenshot, origin top left. Never tap ads or purchases; "
    "close pop-ups; wait while a spinner shows; do not explain."
)


def fit(width: int, height: int, max_pixels: int, patch: int = PATCH_PX) -> tuple[int, int]:
    """The size the model sees: within `max_pixels`, aspect kept, sides multiples of `patch`.

    Never upscales beyond rounding to a whole patch: a small frame gains nothing
    from extra pixels but would pay visual tokens for them.
    """
    scale = min(1.0, math.sqrt(max_pixels / (width * height)))
    w = max(patch, math.floor(width * scale / patch) * patch)
    h = max(patch, math.floor(height * scale / patch) * patch)
    return w, h


def visual_tokens(width: int, height: int, patch: int = PATCH_PX) -> int:
    return max(1, math.ceil(width / patch) * math.ceil(height / patch))


@dataclass(frozen=True)
class Geometry:
    """Original and resized sizes: how model coordinates map back to the phone's pixels."""

    orig_width: int
    orig_height: int
    width: int
    height: int

    def to_original(self, x: int, y: int) -> tuple[int, int]:
        """A point in resized space -> the original pixel under its centre."""
        sx, sy = self.orig_width / self.width, self.orig_height / self.height
        ox = min(self.orig_width - 1, max(0, math.floor((x + 0.5) * sx)))
        oy = min(self.orig_height - 1, max(0, math.floor((y + 0.5) * sy)))
        return ox, oy

    @classmethod
    def of(cls, g: FrameGeometry) -> Geometry:
        return cls(g.orig_width, g.orig_height, g.width, g.height)


# The coordinate pairs of the action contract (click/long_press, swipe).
_POINTS = (("x", "y"), ("x1", "y1"), ("x2", "y2"))


def answer_to_original(text: str, geometry: Geometry) -> str:
    """An answer with every coordinate mapped from resized to original pixels.

    Text that is not a valid answer is returned unchanged: the client's own
    validation reports it, and a half-mapped answer would be worse than none.
    """
    try:
        parse_answer(text)
        obj: Any = json.loads(text)
    except ValueError:
        return text
    actions = obj.get("actions", [obj])
    for action in actions:
        for kx, ky in _POINTS:
            if kx in action and ky in action:
                action[kx], action[ky] = geometry.to_original(action[kx], action[ky])
    return json.dumps(obj, separators=(",", ":"))


def history_text(goal: str, history: list[str]) -> str:
    # The goal is fixed per episode, so it belongs to the reusable prefix too.
    lines = "\n".join(f"{k}: {a}" for k, a in enumerate(history)) or "(none yet)"
    return f"Goal: {goal or 'play'}\nActions so far:\n{lines}\n"


def build_messages(step: AgentStep, frames: list[Image]) -> list[ChatMessage]:
    """Messages for one step; `frames` are the prepared frames, oldest first."""
    parts: list[TextPart | ImagePart] = [TextPart(text=history_text(step.goal, step.history))]
    parts += [ImagePart(hash=f.hash) for f in frames]
    parts.append(TextPart(text=f"Step {step.step}: next action?"))
    return [
        ChatMessage(role="system", content=SYSTEM_PROMPT),
        ChatMessage(role="user", content=parts),
    ]
