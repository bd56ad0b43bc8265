"""A prompt-token estimate for admission, before any tokenizer has seen the prompt.

Deliberately conservative (3 characters per token plus a few tokens of chat framing
per message): the router's admission must never under-charge a tenant. English prose
runs at about 4 characters per token, but schema text (snake_case names, digits,
punctuation) measured 3.3-3.5 with SmolLM2's tokenizer, so 4 would under-count it.
"""

from __future__ import annotations

from switchyard.messages.inference import ChatMessage, TextPart

CHARS_PER_TOKEN = 3
FRAMING_TOKENS = 4  # role markers and separators per message


def estimate_text_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def estimate_tokens(messages: list[ChatMessage]) -> int:
    total = 0
    for m in messages:
        text = (
            m.content
            if isinstance(m.content, str)
            else "".join(p.text for p in m.content if isinstance(p, TextPart))
        )
        total += FRAMING_TOKENS + estimate_text_tokens(text)
    return total
