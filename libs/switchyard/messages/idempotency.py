"""The edge's record of an `Idempotency-Key`: KV `idempotency` (key `<tenant>.<key hash>`).

Every edge reads and writes the same bucket, so a retry that reaches another edge
finds the first request's claim: running (wait for its result) or done (its result).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from switchyard.envelope import Model, RequestId, Token
from switchyard.messages.inference import GenerateResult
from switchyard.messages.sql import SqlAnswer


class Claim(Model):
    """Which request owns an `Idempotency-Key`, the fingerprint of its body, and, once it
    succeeded, its final: a chat's or agent step's result, a question's answer (a failed
    or cancelled request deletes its claim)."""

    v: int = 1
    request_id: RequestId
    fingerprint: Token
    state: Literal["running", "done"] = "running"
    result: Annotated[GenerateResult | SqlAnswer, Field(discriminator="kind")] | None = None
