"""A frame of an agent session's prompt window, as the preprocessor keeps it in KV.

The `window` layout (`switchyard.agentprompt`) lays out the frames of the last
few steps, but a client sends only its current frame (and maybe the previous
one). So every preprocessor replica writes each step's prepared frame to KV
`agent_windows`, one entry per step, and reads the window's earlier frames from
there (`services/preprocessor/window.py`); any replica can serve any step.
"""

from __future__ import annotations

from pydantic import Field

from switchyard.envelope import Model, ShortText, UnixTime
from switchyard.messages.inference import FrameGeometry, Image


class WindowFrame(Model):
    """KV `agent_windows` value (key from `window_key`): step `step`'s prepared frame.

    `start` is the step the window of step `step`'s prompt began at, so the next
    step knows which window it continues (`agentprompt.window_start`).
    `goal_digest` tells a new episode that reuses a session id from an old one.
    """

    v: int = 1
    step: int = Field(ge=0)
    start: int = Field(ge=0)
    goal_digest: ShortText
    image: Image  # the prepared bytes and the pixels' hash, exactly as the prompt carried them
    geometry: FrameGeometry
    at: UnixTime


def window_key(pool: str, tenant: str, session: str, step: int) -> str:
    """`<pool>.<tenant>.<session>.<step>`: all tokens, which KV keys allow as they are."""
    return f"{pool}.{tenant}.{session}.{step}"
