"""A chat request made schedulable: `ChatRequest` -> `GenerateRequest` for `req.llm.<tenant>`.

The only preparation a text request needs is a prompt-token estimate for the router's
admission (`switchyard.token_estimate`). Two callers: the preprocessor, for chat that
clients publish on `llm.in.<tenant>`, and the edge, which prepares its own chat and
publishes it on `req.llm.<tenant>` itself (keeping its `ChatRequest` on INGRESS as the
record, `llm.edge.<tenant>`), one hop and one stream write shorter.
"""

from __future__ import annotations

import time

from switchyard import subjects
from switchyard.envelope import Envelope
from switchyard.messages.inference import ChatRequest, GenerateRequest
from switchyard.token_estimate import estimate_tokens


def prepare_chat(chat: ChatRequest, pool: str) -> GenerateRequest:
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


def prepared_sends(chat: ChatRequest, pool: str) -> list[tuple[str, Envelope]]:
    """What a chat prepared where it was received (the edge) is published as: first the
    `GenerateRequest` on `req.llm.<t>` that runs it, then the `ChatRequest` itself on
    `llm.edge.<t>`, INGRESS's record of it for `sy replay` and `sy trace`."""
    return [
        (subjects.req("llm", chat.tenant), prepare_chat(chat, pool)),
        (subjects.llm_edge(chat.tenant), chat),
    ]
