"""Which prompt layout a step gets, what its frames may weigh, and its prompt-token estimate.

The layouts themselves are `switchyard.agentprompt` (clients need them too).

A `window` request carries all of its window's frames, so W prepared frames
must fit one bus message: the WORK stream's `max_msg_size` and the server's
`max_payload` (both 8 MB in compose, Kubernetes and the embedded server; the
services' `SY_MAX_MESSAGE_BYTES` says the same). The settings refuse a W whose
worst case does not fit (`window_fits`), and the window code restarts a
window whose real frames would not (`services/preprocessor/window.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.agentprompt import AgentLayout, visual_tokens
from switchyard.messages.agent import AgentStep
from switchyard.messages.inference import ChatMessage, Image
from switchyard.token_estimate import estimate_tokens
from switchyard.vlmgeometry import DEFAULT_VLM, VlmName, vlm_profile

# Around each image: <|vision_start|> and <|vision_end|> (Qwen-VL).
IMAGE_FRAMING_TOKENS = 2

# The most bytes a prepared frame takes per pixel, by output format (quality 90):
# random noise, the worst case a lossy coder meets, measured 0.90 (JPEG) and 0.84
# (WebP) bytes per pixel at 1260x700; PNG stores the 3 bytes of each pixel, plus a little.
BYTES_PER_PIXEL = {"jpeg": 1.0, "webp": 1.0, "png": 3.1}
FRAME_HEADER_BYTES = 16 * 1024  # JFIF/EXIF-free headers, quantisation and Huffman tables
# A request's bytes besides its frames: the system prompt, the query, the action
# schema, the envelope and the images' fields.
REQUEST_OVERHEAD_BYTES = 64 * 1024
# The longest goal and history an `AgentStep` admits, as UTF-8 (up to 4 bytes a character).
MAX_STEP_TEXT_BYTES = 4 * (2048 + 256 * 512)


@dataclass(frozen=True)
class LayoutChoice:
    layout: AgentLayout
    window: int  # frames per window (W); only `window` uses it

    @property
    def frames(self) -> int:
        """The most frames a prompt of this layout holds."""
        return {"pair": 2, "single": 1, "window": self.window}[self.layout]


def frame_bytes_bound(max_pixels: int, frame_format: str) -> int:
    """The most bytes one prepared frame of at most `max_pixels` pixels can take."""
    return int(max_pixels * BYTES_PER_PIXEL[frame_format]) + FRAME_HEADER_BYTES


def step_text_bytes(step: AgentStep) -> int:
    """The bytes a step's own text adds to its request, besides the fixed overhead."""
    return len(step.goal.encode()) + sum(len(h.encode()) for h in step.history)


def window_fits(window: int, max_pixels: int, frame_format: str, limit: int) -> str | None:
    """Why `window` frames of the worst case do not fit a message of `limit` bytes, or None."""
    frame = frame_bytes_bound(max_pixels, frame_format)
    need = window * frame + MAX_STEP_TEXT_BYTES + REQUEST_OVERHEAD_BYTES
    if need <= limit:
        return None
    most = max(0, (limit - MAX_STEP_TEXT_BYTES - REQUEST_OVERHEAD_BYTES) // frame)
    return (
        f"a window of {window} frames needs up to {need:,} bytes per request "
        f"({window} x {frame:,} for {max_pixels:,}-pixel {frame_format} frames, plus the "
        f"longest history), more than a message may carry ({limit:,} bytes: "
        f"SY_MAX_MESSAGE_BYTES and the NATS server's max_payload); at most {most} frames "
        f"fit - lower the window (SY_AGENT_WINDOW or the tenant's), SY_MAX_PIXELS, or "
        f"raise both message limits"
    )


def estimate_prompt_tokens(
    messages: list[ChatMessage], frames: list[Image], vlm: VlmName = DEFAULT_VLM
) -> int:
    """Text (conservative, ~4 chars/token) + visual tokens from each frame's size, counted
    with profile `vlm`'s token size.

    `frames` are the images the layout put in the prompt (one per `ImagePart`),
    so the estimate follows the layout: two frames for `pair`, one for
    `single`, the window's for `window`.
    """
    patch = vlm_profile(vlm).patch_px
    visual = sum(visual_tokens(f.width, f.height, patch) + IMAGE_FRAMING_TOKENS for f in frames)
    return estimate_tokens(messages) + visual


def estimate_window_tokens(
    prompt_tokens: int, frames: list[Image], choice: LayoutChoice, max_tokens: int,
    vlm: VlmName = DEFAULT_VLM,
) -> int:  # fmt: skip
    """The KV tokens a session of `choice` keeps cached at its fullest
    (`GenerateRequest.kv_window_tokens`): this prompt (`prompt_tokens`, with `frames`),
    the frames its layout holds beyond these, each the size of the last, and the answer.
    The history's growth is left out: a line of text per step, where a frame is ~900
    tokens."""
    if not frames:
        return prompt_tokens + max_tokens
    last = frames[-1]
    per_frame = visual_tokens(last.width, last.height, vlm_profile(vlm).patch_px)
    more = max(0, choice.frames - len(frames)) * (per_frame + IMAGE_FRAMING_TOKENS)
    return prompt_tokens + more + max_tokens
