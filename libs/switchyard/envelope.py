"""The versioned envelope every Switchyard message carries, and its field types.

Models are strict (no silent coercion), reject unknown fields and cap every
string, list and byte field, so a hostile payload is refused with a reason
before it costs memory or reaches a model.
"""

from __future__ import annotations

import time
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from switchyard.ids import new_id
from switchyard.tracing import new_traceparent

ENVELOPE_VERSION = 1

# A NATS subject token: no dots, spaces or wildcards, so it can sit inside a subject.
Token = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
TenantId = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
RequestId = Token
SessionId = Token
Subject = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_$.>*-]{1,256}$")]
Traceparent = Annotated[
    str, StringConstraints(pattern=r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
]
ShortText = Annotated[str, StringConstraints(max_length=256)]
Text = Annotated[str, StringConstraints(max_length=256 * 1024)]
UnixTime = Annotated[float, Field(ge=0)]


class Model(BaseModel):
    """Base of every payload model: strict, closed, immutable."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        ser_json_bytes="base64",
        val_json_bytes="base64",
    )


class Envelope(Model):
    """Header fields shared by every message on the bus.

    `kind` is the message type (a literal in each subclass) so a decoder can pick
    the model; `deadline` and `frame_ts` are absolute Unix seconds.
    """

    KIND: ClassVar[str] = ""

    v: int = ENVELOPE_VERSION
    id: RequestId = Field(default_factory=new_id)
    tenant: TenantId
    kind: str
    created_at: UnixTime = Field(default_factory=time.time)
    deadline: UnixTime | None = None
    priority: int = Field(default=0, ge=0, le=9)
    session: SessionId | None = None
    frame_ts: UnixTime | None = None
    reply: Subject | None = None
    # W3C traceparent; a message made without one starts a trace of its own.
    trace: Traceparent | None = Field(default_factory=new_traceparent)

    def expired(self, now: float | None = None) -> bool:
        return self.deadline is not None and (time.time() if now is None else now) > self.deadline

    def remaining(self, now: float | None = None) -> float | None:
        if self.deadline is None:
            return None
        return self.deadline - (time.time() if now is None else now)
