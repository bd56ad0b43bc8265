"""The edge's record of an `Idempotency-Key`: KV `idempotency` (key `<tenant>.<key hash>`).

Every edge reads and writes the same bucket, so a retry that reaches another edge
finds the first request's claim: running (wait for its result) or done (its result).
"""

from __future__ import annotations

from typing import Literal

from switchyard.envelope import Model, RequestId, Token
from switchyard.messages.inference import GenerateResult


class Claim(Model):
    """Which request owns an `Idempotency-Key`, the fingerprint of its body, and, once it
    succeeded, its result (a failed or cancelled request deletes its claim)."""

    v: int = 1
    request_id: RequestId
    fingerprint: Token
    state: Literal["running", "done"] = "running"
    result: GenerateResult | None = None
