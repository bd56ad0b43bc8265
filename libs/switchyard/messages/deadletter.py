"""Dead letters: a message the fleet gave up on, with the reason, on `dlq.<subject>`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from switchyard.envelope import Model, ShortText, Subject, Text, UnixTime
from switchyard.errors import ErrorCode


class DeadLetter(Model):
    kind: Literal["dead_letter"] = "dead_letter"
    v: int = 1
    subject: Subject
    stream: ShortText
    consumer: ShortText
    stream_seq: int = Field(ge=0)
    deliveries: int = Field(ge=0)
    code: ErrorCode
    reason: Text
    at: UnixTime
    headers: dict[ShortText, ShortText] = {}
    payload: bytes = Field(max_length=16 * 1024 * 1024)
    request_id: Annotated[str, Field(max_length=64)] | None = None
