"""The prompt-token estimate of an agent step, for the router's admission.

The layout itself is `switchyard.agentprompt` (clients need it too).
"""

from __future__ import annotations

from switchyard.agentprompt import visual_tokens
from switchyard.messages.inference import ChatMessage, Image
from switchyard.token_estimate import estimate_tokens

# Around each image: <|vision_start|> and <|vision_end|> (Qwen-VL).
IMAGE_FRAMING_TOKENS = 2


def estimate_prompt_tokens(messages: list[ChatMessage], frames: list[Image]) -> int:
    """Text (conservative, ~4 chars/token) + visual tokens from each frame's size."""
    visual = sum(visual_tokens(f.width, f.height) + IMAGE_FRAMING_TOKENS for f in frames)
    return estimate_tokens(messages) + visual
