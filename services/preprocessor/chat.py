"""OpenAI-style chat from `llm.in.<tenant>` becomes a `GenerateRequest` on `req.llm.<tenant>`.

The only preparation a text request needs is a prompt-token estimate for the
router's admission; it is deliberately conservative (about 4 characters per
token plus a few tokens of chat framing per message), since admission must
never under-charge before the engine's tokenizer has seen the prompt.
"""

from __future__ import annotations

from switchyard import subjects
from switchyard.messages.inference import ChatMessage, ChatRequest, GenerateRequest, TextPart

CHARS_PER_TOKEN = 4
FRAMING_TOKENS = 4  # role markers and separators per message


def estimate_tokens(messages: list[ChatMessage]) -> int:
    total = 0
    for m in messages:
        text = (
            m.content
            if isinstance(m.content, str)
            else "".join(p.text for p in m.content if isinstance(p, TextPart))
        )
        total += FRAMING_TOKENS + -(-len(text) // CHARS_PER_TOKEN)
    return total


def to_generate(chat: ChatRequest, pool: str) -> GenerateRequest:
    """Same id (so dedupe and cancel follow the request), same envelope, engine-ready body."""
    return GenerateRequest(
        id=chat.id,
        tenant=chat.tenant,
        created_at=chat.created_at,
        deadline=chat.deadline,
        priority=chat.priority,
        session=chat.session,
        reply=chat.reply,
        trace=chat.trace,
        workload="llm",
        pool=pool,
        model=chat.model,
        messages=list(chat.messages),
        sampling=chat.sampling,
        constraint=chat.constraint,
        prompt_tokens=estimate_tokens(list(chat.messages)),
        stream=chat.stream,
    )


def subject_for(req: GenerateRequest) -> str:
    return subjects.req(req.workload, req.tenant)
