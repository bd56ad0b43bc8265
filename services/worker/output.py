"""The worker's output step: an agent step's finished text -> the answer its result carries.

Beside the runner as vLLM's output processor is beside `AsyncLLM`: the answer is parsed
once, here, and travels typed (`GenerateResult.actions`, `thought`), so nothing
downstream parses it again. Stopped at `max_tokens` (even when it parses: `click 520 11`
may start `click 520 1180`) or not in the step's language, it is cut: the runner answers
`answer_cut`, never part of an action to a phone. Whole, its points are mapped to the
phone's pixels (`agentprompt.Geometry`, by the request's VLM profile) and it is written
again in its format (`agentactions.encode_answer`): a text the grammar admits comes back
byte for byte but for its points (`grid`: byte for byte, its points on the grid).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Literal, NamedTuple

from switchyard.agentactions import (
    FORMAT_COORDS,
    ActionFormatError,
    Answer,
    encode_answer,
    is_wrapped,
    map_points,
    parse_answer_text,
)
from switchyard.agentprompt import Geometry
from switchyard.messages.inference import ActionsConstraint, FinishReason, FrameGeometry


class Cut(NamedTuple):
    """An answer no phone may act on: the engine stopped at max_tokens (`length`), or what
    it wrote is not an answer of the step's language (`unparseable`); `detail` quotes it."""

    reason: Literal["length", "unparseable"]
    detail: str


@dataclass(frozen=True)
class AgentAnswer:
    """A whole answer in the phone's pixels: what it says (the result's `actions` and
    `thought`), and the same as text in the step's format (the result's `text`)."""

    answer: Answer
    text: str


def agent_answer(
    text: str, finish: FinishReason | None, c: ActionsConstraint, frame: FrameGeometry | None
) -> AgentAnswer | Cut:
    """What `text` (an engine's whole output for a step constrained by `c`, stopped for
    `finish`) answers, mapped to the original frame `frame` when the request has one."""
    fmt = c.action_format
    if finish == "length":
        return Cut("length", f"the answer reached max_tokens before it was whole: {text[:120]!r}")
    try:
        answer = parse_answer_text(text, fmt, chunk=c.chunk, thought=c.thought)
        if frame is None:
            return AgentAnswer(answer, text)
        to = partial(Geometry.of(frame).to_original, coords=FORMAT_COORDS[fmt])
        mapped = map_points(answer, to)
        if fmt == "grid":
            # The grid's digits cannot name a phone's pixel: its text stays the model's (on
            # the grid), the actions the phone executes are in its pixels.
            return AgentAnswer(mapped, text)
        # JSON in the step's shape (`answer_schema(chunk, thought)`, the one its grammar
        # allows). An answer the format cannot write again (a JSON thought with a control
        # character: no grammar admits one) is refused like any other.
        wrapped = is_wrapped(c.chunk, c.thought)
        return AgentAnswer(mapped, encode_answer(mapped, fmt, wrapped=wrapped))
    except ActionFormatError as e:
        return Cut("unparseable", f"the answer is not a valid {fmt} answer ({e}): {text[:120]!r}")
