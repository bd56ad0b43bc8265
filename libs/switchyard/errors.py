"""Typed errors that cross process boundaries.

Every refusal the fleet gives a caller carries one of these codes, so a client
(and the edge's HTTP mapping) can act on the reason instead of parsing text.
"""

from __future__ import annotations

from typing import Literal

ErrorCode = Literal[
    "malformed",  # not msgpack / not JSON
    "truncated",  # payload ended early
    "oversized",  # payload or a field over its limit
    "version",  # envelope version we do not speak
    "schema",  # decoded but does not match the model
    "unknown_tenant",
    "unauthorized",
    "forbidden",
    "over_quota",
    "no_capacity",
    "expired",  # deadline passed
    "stale",  # agent frame older than its budget
    "superseded",  # a newer step of the same agent session replaced it before it started
    "cancelled",
    "invalid_request",
    "engine_error",
    "answer_cut",  # an agent answer stopped at max_tokens or not in the step's action format
    "context_length",
    "rejected_sql",
    "db_error",
    "timeout",
    "internal",
]


class SwitchyardError(Exception):
    """Base of every typed error; `code` is stable, `reason` is for humans."""

    code: ErrorCode = "internal"

    def __init__(self, reason: str, *, code: ErrorCode | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.reason}"


class DecodeError(SwitchyardError):
    """A payload could not become a message. `code` says why."""

    code: ErrorCode = "malformed"


class TransientError(SwitchyardError):
    """Worth retrying later (with backoff): a dependency is briefly unavailable."""

    code: ErrorCode = "internal"


class ProvisioningError(SwitchyardError):
    """An existing stream, consumer or bucket conflicts with the declared one."""

    code: ErrorCode = "invalid_request"


class StreamTimeout(SwitchyardError):
    """A token stream went silent before its end-of-stream frame."""

    code: ErrorCode = "timeout"
