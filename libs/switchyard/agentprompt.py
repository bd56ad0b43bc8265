"""The agent step's prompt layouts and frame geometry, shared by the preprocessor and clients.

Three layouts (`AgentLayout`), chosen per pool and tenant by the preprocessor
(`SY_AGENT_LAYOUT`, `SY_AGENT_WINDOW`, `SY_AGENT_TENANT_LAYOUTS`); the client's
step (`AgentStep`) is the same for all of them:

    pair    [system][goal, action history][previous frame][current frame][query]
    single  [system][goal, action history][current frame][query]
    window  [system][goal, actions before the window][frame c][action c]...
            [frame k-1][action k-1][frame k][query]

What all three keep: the system prompt is byte-identical for every step of
every episode (one per layout), the goal is fixed per episode, and actions
enter the prompt as text (a few tokens each), never as old frames.

`pair`: the history only grows at its end, so step k+1 starts with everything
of step k up to the end of step k's history. Its known limit: the previous
frame sits *after* a history that grew by one line, so its KV position changed
and a positional prefix cache cannot serve it - both frames are prefilled at
every step. What its stable hash still saves is the vision encoder's work
(vLLM caches encoder outputs by multimodal uuid). Kept for models trained on it.

`single`: the same sharing with one frame, so one frame less to prefill and carry.

`window`: append-only within a window of at most W frames. Step k's prompt is
step k-1's without its trailing query, plus action k-1, frame k and the query,
so between compactions everything up to frame k-1 is a cached prefix and only
the last action, the new frame and the query are prefilled. Every W frames the
window compacts (`window_start`): its frames leave the prompt, their actions
join the text history, and the first step of the new window shares the system
prompt, the goal and the actions before the old window. The client sends only
the current frame (and maybe the previous one); the preprocessor keeps each
session's window (`services/preprocessor/window.py`). What it costs: a prompt,
and the KV a session holds, grows to W frames, and every request carries the
bytes of all its window's frames over the bus.

A phone that sends its next step while a chunk still executes (asynchronous
inference) names that chunk's unfinished actions (`pending_text`), in the query
after the last frame, where no later step's prefix reaches.

The actions are the client's history, the source of truth: its last entry is
the action of step `step - 1`, the one before it of `step - 2`, and so on, so a
client may send only the tail of a long history. A window action the history
does not reach is written `(not reported)`.

Measured with the sim engine's pseudo-tokenizer and 16-token KV blocks (what
its prefix cache can serve, with unbounded cache), 20-step episode, 1280x720
frames (1280x704 after `fit` in the default profile's 32-px tokens, Qwen3-VL's: 880
visual tokens each), a JSON action history, the default (compact) system prompt
(`python -m switchyard.bench.layoutcost --write`; `tests/unit/test_agentprompt_layouts.py`
recomputes this table):

| layout | W | prompt tokens, mean / max | prefill per step, mean (min-max) | ideal hit rate |
| --- | --- | --- | --- | --- |
| pair | - | 2,108 / 2,387 | 1,808 (1,793-1,834) | 16.4 % |
| single | - | 1,266 / 1,501 | 926 (916-949) | 27.4 % |
| window | 4 | 2,611 / 4,169 | 941 (916-1,006) | 65.1 % |
| window | 8 | 4,024 / 7,592 | 943 (916-1,086) | 77.4 % |

Prefill per step is over steps 1-19, hit rate = cached / prompt tokens over
the same steps. `single` and `window` prefill the same (one new frame and a line
of text; a window's compaction adds its actions' lines), half of `pair`: at the
sim's A100 calibration (0.11 ms per uncached token) about 100 ms instead of 200.
What `window` buys is context - the model sees up to W frames for the prefill of
one - and what it pays is KV: a session holds its whole prompt, up to W frames.

Geometry lives here too because both sides need it: the preprocessor resizes
with `fit`, and whoever executes an action maps its coordinates back with
`Geometry.to_original`. Both follow the pool's VLM profile
(`switchyard.vlmgeometry`, `SY_AGENT_VLM`): its visual-token size (32 px for
Qwen3-VL, the default, which the table above assumes; 28 px for Qwen2.5-VL) and its
coordinate convention, which the system prompt states (`system_prompt`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from switchyard.agentactions import ANSWER_INSTRUCTIONS, FORMAT_COORDS
from switchyard.messages.agent import DEFAULT_ACTION_FORMAT, ActionFormat, AgentStep
from switchyard.messages.inference import ChatMessage, FrameGeometry, Image, ImagePart, TextPart
from switchyard.vlmgeometry import (
    DEFAULT_VLM,
    PROFILES,
    RELATIVE_SCALE,
    Coords,
    VlmName,
    vlm_profile,
)

# The default profile's visual token (Qwen3-VL: 16 px patches merged 2x2, 32x32 px);
# callers that know the pool's profile pass its `patch_px`.
PATCH_PX = PROFILES[DEFAULT_VLM].patch_px

AgentLayout = Literal["pair", "single", "window"]
LAYOUTS: tuple[AgentLayout, ...] = ("pair", "single", "window")
# The most frames a window holds: GenerateRequest.images and the parts of one
# message are capped to match (the bytes are checked by the preprocessor).
MAX_WINDOW = 16
# `window` by default: one frame prefilled per step and the most prefix reuse, the layout
# that serves the most phones under 500 ms (README, "Agent steps"); `pair` and `single`
# stay selectable (SY_AGENT_LAYOUT, per tenant SY_AGENT_TENANT_LAYOUTS).
DEFAULT_LAYOUT: AgentLayout = "window"
DEFAULT_WINDOW = 8  # frames (SY_AGENT_WINDOW): a vLLM worker must accept as many per prompt

_SEES: dict[AgentLayout, str] = {
    "pair": "the previous and the current screenshot and the actions taken so far",
    "single": "the current screenshot and the actions taken so far",
    "window": (
        "the screenshots of the last few steps, each followed by the action taken on "
        "it, then the current screenshot; earlier actions are listed as text"
    ),
}


# How a profile's model writes a point (`VlmProfile.coords`), in the model's own terms.
_COORDS = {
    "pixels": "Coordinates are pixels of the current screenshot, origin top left.",
    "relative-1000": (
        "Coordinates are relative, 0-1000 across the current screenshot's width and "
        "height, origin top left."
    ),
}


def system_prompt(
    layout: AgentLayout,
    action_format: ActionFormat = DEFAULT_ACTION_FORMAT,
    vlm: VlmName = DEFAULT_VLM,
) -> str:
    """What the model is told: what it sees (`layout`), how to answer (`action_format`,
    `agentactions.ANSWER_INSTRUCTIONS`; a grammar forces the same syntax) and in which
    coordinates (the convention of profile `vlm`, the one the worker maps back from; a
    format with a convention of its own, `grid`, states it in its instructions)."""
    coords = "" if FORMAT_COORDS[action_format] else f"{_COORDS[vlm_profile(vlm).coords]} "
    return (
        "You are an agent that plays a mobile game on a cloud phone. Each step you see "
        f"{_SEES[layout]}. {ANSWER_INSTRUCTIONS[action_format]} "
        f"{coords}Never tap ads or purchases; "
        "close pop-ups; wait while a spinner shows; do not explain."
    )


# The JSON prompts of the default profile, per layout (the one the agent prompt has always
# carried for `pair`).
SYSTEM_PROMPTS: dict[AgentLayout, str] = {layout: system_prompt(layout) for layout in LAYOUTS}
SYSTEM_PROMPT = SYSTEM_PROMPTS["pair"]


def fit(width: int, height: int, max_pixels: int, patch: int = PATCH_PX) -> tuple[int, int]:
    """The size the model sees: within `max_pixels`, aspect kept, sides multiples of `patch`
    (the pool's `VlmProfile.patch_px`: then the engine's own resize keeps it as it is).

    Never upscales beyond rounding to a whole patch: a small frame gains nothing
    from extra pixels but would pay visual tokens for them.
    """
    scale = min(1.0, math.sqrt(max_pixels / (width * height)))
    w = max(patch, math.floor(width * scale / patch) * patch)
    h = max(patch, math.floor(height * scale / patch) * patch)
    return w, h


def visual_tokens(width: int, height: int, patch: int = PATCH_PX) -> int:
    """Visual tokens of a `width` x `height` frame, one per `patch` x `patch` square."""
    return max(1, math.ceil(width / patch) * math.ceil(height / patch))


@dataclass(frozen=True)
class Geometry:
    """Original and resized sizes and the VLM profile: how model coordinates map back to
    the phone's pixels."""

    orig_width: int
    orig_height: int
    width: int
    height: int
    vlm: VlmName = DEFAULT_VLM

    def to_original(self, x: int, y: int, coords: Coords | None = None) -> tuple[int, int]:
        """A point as the model writes it -> the original pixel under it, clamped to the frame.

        `pixels`: (x, y) names a pixel of the resized frame; the original pixel under
        its centre. `relative-1000`: (x, y) is a position, x/1000 of the width from
        the left edge; the original pixel that contains it, floor(x/1000 * width) -
        the same "pixel under the point" rule, on a scale with no pixels of its own.
        1000 is the far edge itself, inside no pixel: it clamps to the last one, as
        does anything beyond the frame (the grammar's bounds are the same for every
        profile, `agentactions.COORD`). `coords` names the convention when the answer's
        format has its own (`agentactions.FORMAT_COORDS`), else it is the profile's.
        """
        if (coords or vlm_profile(self.vlm).coords) == "relative-1000":
            # Integer arithmetic: exact, no float rounding at the pixel boundaries.
            ox, oy = x * self.orig_width // RELATIVE_SCALE, y * self.orig_height // RELATIVE_SCALE
        else:
            sx, sy = self.orig_width / self.width, self.orig_height / self.height
            ox, oy = math.floor((x + 0.5) * sx), math.floor((y + 0.5) * sy)
        return min(self.orig_width - 1, max(0, ox)), min(self.orig_height - 1, max(0, oy))

    @classmethod
    def of(cls, g: FrameGeometry) -> Geometry:
        return cls(g.orig_width, g.orig_height, g.width, g.height, g.vlm)

    def frame_geometry(self) -> FrameGeometry:
        """What a request records (`GenerateRequest.frame_geometry`), profile included."""
        return FrameGeometry(
            orig_width=self.orig_width, orig_height=self.orig_height,
            width=self.width, height=self.height, vlm=self.vlm,
        )  # fmt: skip


def history_text(goal: str, history: list[str], first: int = 0) -> str:
    """Goal and actions as text, the actions numbered from `first`."""
    # The goal is fixed per episode, so it belongs to the reusable prefix too.
    lines = "\n".join(f"{first + k}: {a}" for k, a in enumerate(history)) or "(none yet)"
    return f"Goal: {goal or 'play'}\nActions so far:\n{lines}\n"


def pending_text(pending: list[str]) -> str:
    """The actions of the current chunk the phone has yet to finish (`StepFields.pending`,
    real-time chunking's inpainting, [S0] 2.3), for the step's query: the answer goes on
    after them. It sits in the query, after the last frame, so it never enters the prefix
    the next step reuses; without pending actions it is empty and the query unchanged."""
    return f"Still executing: {'; '.join(pending)}\n" if pending else ""


def window_start(previous: int | None, step: int, window: int) -> int:
    """The step a window layout's prompt starts its frames at, for step `step`.

    `previous` is the start the session's step `step - 1` used, or None when it
    is unknown (first step, a lost or expired window, steps not consecutive):
    then the window restarts at `step`, as it does when it already holds
    `window` frames (compaction). So a session's windows are [0, W), [W, 2W),
    ... until something restarts one.
    """
    if previous is None or previous > step - 1 or step - previous >= window:
        return step
    return previous


def _action(history: list[str], step: int, s: int) -> str:
    back = step - s  # history[-1] is the action of step - 1
    return history[-back] if 0 < back <= len(history) else "(not reported)"


def _window_parts(step: AgentStep, frames: list[Image]) -> list[TextPart | ImagePart]:
    start = step.step - len(frames) + 1
    if start < 0:
        raise ValueError(f"step {step.step} cannot have a window of {len(frames)} frames")
    # The history entries of steps before the window, numbered by step, so the
    # text of steps before `start` stays byte-identical while the history grows.
    before = max(0, len(step.history) - (step.step - start))
    first = step.step - len(step.history)
    parts: list[TextPart | ImagePart] = [
        TextPart(text=history_text(step.goal, step.history[:before], max(0, first)))
    ]
    for s, frame in enumerate(frames[:-1], start):
        parts += [
            ImagePart(hash=frame.hash),
            TextPart(text=f"{s}: {_action(step.history, step.step, s)}\n"),
        ]
    return [*parts, ImagePart(hash=frames[-1].hash)]


def build_messages(
    step: AgentStep,
    frames: list[Image],
    layout: AgentLayout = DEFAULT_LAYOUT,
    vlm: VlmName = DEFAULT_VLM,
) -> list[ChatMessage]:
    """Messages for one step in `layout`; `frames` are the prepared frames, oldest first.

    The system prompt asks for the step's action format (`StepOptions.action_format`) in
    the coordinates of profile `vlm` (the pool's: its frames were resized for it).
    `pair`: the frames the step carried (previous and current, or the current
    alone). `single`: the current frame only. `window`: the window's frames, of
    steps `step.step - len(frames) + 1` .. `step.step`.
    """
    if not frames:
        raise ValueError("a step needs at least its current frame")
    if layout == "single" and len(frames) != 1:
        raise ValueError(f"the single layout takes the current frame only, got {len(frames)}")
    if layout == "window":
        if len(frames) > MAX_WINDOW:
            raise ValueError(f"a window holds at most {MAX_WINDOW} frames, got {len(frames)}")
        parts = _window_parts(step, frames)
    else:
        parts = [TextPart(text=history_text(step.goal, step.history))]
        parts += [ImagePart(hash=f.hash) for f in frames]
    parts.append(TextPart(text=f"{pending_text(step.pending)}Step {step.step}: next action?"))
    return [
        ChatMessage(role="system", content=system_prompt(layout, step.options.action_format, vlm)),
        ChatMessage(role="user", content=parts),
    ]
