"""OpenAI's error object, and how fleet error codes become HTTP statuses.

Every error body carries the request id so a client's report can be matched to
the fleet's logs and results. An error is built with its final status: a route
whose statuses differ from the shared table (the agent step's) passes its own
over it, nothing re-maps an error after the fact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from switchyard.errors import ErrorCode
from switchyard.messages.inference import ErrorInfo

# code -> (HTTP status, OpenAI error type)
STATUS: dict[ErrorCode, tuple[int, str]] = {
    "malformed": (400, "invalid_request_error"),
    "truncated": (400, "invalid_request_error"),
    "schema": (400, "invalid_request_error"),
    "version": (400, "invalid_request_error"),
    "invalid_request": (400, "invalid_request_error"),
    "context_length": (400, "invalid_request_error"),
    "rejected_sql": (400, "invalid_request_error"),
    "oversized": (413, "invalid_request_error"),
    "unauthorized": (401, "invalid_request_error"),
    "forbidden": (403, "permission_error"),
    "unknown_tenant": (403, "permission_error"),  # a key whose tenant has no policy
    "over_quota": (429, "rate_limit_error"),
    "no_capacity": (503, "service_unavailable_error"),
    "stale": (408, "timeout_error"),
    # A newer step of the same agent session replaced it before it ran: that one's answer
    # is the one to act on.
    "superseded": (409, "invalid_request_error"),
    "timeout": (408, "timeout_error"),  # queued too long / stream went silent
    "expired": (504, "timeout_error"),  # the request's deadline passed
    "cancelled": (499, "cancelled_error"),
    "engine_error": (502, "server_error"),
    # An agent answer stopped at max_tokens or not an action: never passed on in part.
    "answer_cut": (502, "server_error"),
    "db_error": (502, "server_error"),
    "internal": (500, "server_error"),
}

# code -> HTTP status, for a route whose statuses differ from `STATUS` for some codes.
Statuses = Mapping[str, int]
NO_OVERRIDES: Statuses = {}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        *,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param
        self.retry_after = retry_after

    @classmethod
    def from_info(cls, info: ErrorInfo, statuses: Statuses = NO_OVERRIDES) -> ApiError:
        """The HTTP error of a fleet error; `statuses` overrides the shared table's status
        for some codes (the OpenAI error type stays the table's)."""
        status, type_ = STATUS.get(info.code, (500, "server_error"))
        status = statuses.get(info.code, status)
        return cls(status, info.reason, type_, info.code, retry_after=info.retry_after)

    def body(self, request_id: str | None) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
                "request_id": request_id,
            }
        }

    def headers(self, request_id: str | None) -> dict[str, str]:
        headers = {"x-request-id": request_id} if request_id else {}
        if self.retry_after is not None:
            # Whole seconds, rounded up: HTTP's Retry-After has no fractions.
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        return headers


class Forbidden(ApiError):
    """The key is valid but may not use this model or pool."""

    def __init__(self, message: str) -> None:
        super().__init__(403, message, "permission_error")


class Unavailable(ApiError):
    """The fleet (or its state) could not be reached: worth retrying later."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message, "service_unavailable_error", "no_capacity")


class ClientGone(ApiError):
    """The client went away before the answer; nobody reads this error, but its status
    (nginx's 499) is what the request is counted as."""

    def __init__(self) -> None:
        super().__init__(499, "client disconnected", "cancelled_error", "cancelled")


# The error body's schema and the statuses the API routes document, for OpenAPI.
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
                "request_id": {"type": ["string", "null"]},
            },
            "required": ["message", "type"],
        }
    },
    "required": ["error"],
}


def error_responses(descriptions: Mapping[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses, each with the error body's schema."""
    return {
        code: {"description": desc, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
        for code, desc in descriptions.items()
    }


API_ERRORS = error_responses({
    400: "Invalid request", 401: "Missing or unknown API key",
    403: "Key not allowed this model", 404: "Unknown model",
    408: "Queued too long", 409: "Agent frame stale (code `stale`)",
    413: "Body or frame too large", 422: "Validation error",
    429: "Over quota (see Retry-After)", 503: "No capacity", 504: "Deadline passed",
})  # fmt: skip
