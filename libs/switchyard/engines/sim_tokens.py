"""The simulator's pseudo-tokens: what `SimEngine` counts, caches and streams.

The simulator has no tokenizer and needs none: its timings, KV blocks and
prefix hits only need token *counts* and token *identity* that behave like a
real model's. This module holds the three pieces that provide them:

- `pseudo_tokens`: a deterministic tokenizer shaped like a byte-level BPE's
  pre-tokenizer (roughly 4 characters per token for English): a word of up to
  6 letters with its leading space, one token per digit, runs of up to 3
  punctuation characters (`{"`, `":"`, `},`), each other whitespace character
  alone. Joining the pieces gives back the text exactly, so output pieces can
  be streamed as they are. On agent answers it counts within 10 % of
  SmolLM2's real tokenizer in both action formats (click: 18 JSON / 10
  compact tokens; `tests/unit/test_agent_actions_tokens.py` holds it within
  20 %), and on English prompts within a few per cent.
- `image_tokens`: the visual tokens of one frame, counted the way Qwen-VL does
  (one token per `image_patch_px` square - the simulated VLM's, `SimSettings.vlm`
  - pixels clamped to a min and max) and
  derived from the frame's content hash, so a repeated frame is a repeated
  prefix.
- `render_prompt`: a request's messages (or raw prompt) and images laid out in
  a Qwen-style chat format.

`WORDS` is the filler vocabulary of simulated free text and strings.
"""

from __future__ import annotations

import math
import re
from typing import Protocol

from switchyard.engines.base import EngineRequest
from switchyard.messages.inference import Image, ImagePart

# Digits are one token each and a space before a digit is its own (SmolLM2 and
# Qwen2 split numbers so): an action's cost is mostly its coordinates' digits.
_TOKEN_RE = re.compile(r" ?[A-Za-z]{1,6}|\d| ?[^\sA-Za-z\d]{1,3}|\s")


def pseudo_tokens(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


WORDS = (
    "the", "agent", "taps", "the", "button", "then", "waits", "for", "the", "screen",
    "to", "load", "and", "checks", "score", "menu", "level", "next", "ok", "done",
)  # fmt: skip


class ImageTokenSettings(Protocol):
    """The settings `image_tokens` reads (`SimSettings` has them)."""

    tokens_per_image: int  # when an image has no size
    image_patch_px: int  # px per visual token side
    image_min_pixels: int
    image_max_pixels: int


def image_tokens(image_hash: str, image: Image | None, s: ImageTokenSettings) -> list[str]:
    """Visual tokens of one frame, derived from its content hash: same frame, same tokens."""
    if image is None:
        n = s.tokens_per_image
    else:
        pixels = min(max(image.width * image.height, s.image_min_pixels), s.image_max_pixels)
        n = max(1, math.ceil(pixels / (s.image_patch_px * s.image_patch_px)))
    return ["<|vision_start|>", *(f"<img:{image_hash}:{i}>" for i in range(n)), "<|vision_end|>"]


def render_prompt(request: EngineRequest, s: ImageTokenSettings) -> list[str]:
    """Pseudo-tokens of the prompt (a Qwen-style chat layout).

    Images sit where an `ImagePart` names them; images no part names go first
    in the last user message (or before a raw prompt). A part naming an image
    that the request does not carry costs `tokens_per_image`.
    """
    by_hash = {img.hash: img for img in request.images}
    if request.messages is None:
        tokens: list[str] = []
        for img in request.images:
            tokens += image_tokens(img.hash, img, s)
        return tokens + pseudo_tokens(request.prompt or "")
    loose = request.loose_images()
    users = [i for i, m in enumerate(request.messages) if m.role == "user"]
    last_user = users[-1] if users else -1
    tokens = []
    for i, m in enumerate(request.messages):
        tokens += ["<|im_start|>", m.role, "\n"]
        if i == last_user:
            for img in loose:
                tokens += image_tokens(img.hash, img, s)
        if isinstance(m.content, str):
            tokens += pseudo_tokens(m.content)
        else:
            for part in m.content:
                if isinstance(part, ImagePart):
                    tokens += image_tokens(part.hash, by_hash.get(part.hash), s)
                else:
                    tokens += pseudo_tokens(part.text)
        tokens += ["<|im_end|>", "\n"]
    if last_user < 0:
        for img in loose:
            tokens += image_tokens(img.hash, img, s)
    return [*tokens, "<|im_start|>", "assistant", "\n"]
