"""Server-sent events in the shape OpenAI's clients parse: `data: <json>\n\n`, then `[DONE]`."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

HEADERS = {
    "Cache-Control": "no-cache",
    # Proxies (nginx) must not buffer a token stream.
    "X-Accel-Buffering": "no",
}
DONE = "data: [DONE]\n\n"
HEARTBEAT = ": keep-alive\n\n"  # a comment: clients ignore it, idle proxies see traffic


def event(payload: BaseModel | dict[str, Any]) -> str:
    if isinstance(payload, BaseModel):
        return f"data: {payload.model_dump_json()}\n\n"
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
