"""OpenAI-style chat from `llm.in.<tenant>` becomes a `GenerateRequest` on `req.llm.<tenant>`.

The only preparation a text request needs is a prompt-token estimate for the
router's admission (`switchyard.token_estimate`).
"""

from __future__ import annotations

import time

from switchyard import subjects
from switchyard.messages.inference import ChatRequest, GenerateRequest
from switchyard.token_estimate import estimate_tokens


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
        prepared_at=time.time(),
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
