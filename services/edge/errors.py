"""OpenAI's error object, and how fleet error codes become HTTP statuses.

Every error body carries the request id so a client's report can be matched to
the fleet's logs and results.
"""

from __future__ import annotations

import math
from typing import Any

from switchyard.errors import ErrorCode
from switchyard.messages.inference import ErrorInfo, GenerateResult

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
    "timeout": (408, "timeout_error"),  # queued too long / stream went silent
    "expired": (504, "timeout_error"),  # the request's deadline passed
    "cancelled": (499, "cancelled_error"),
    "engine_error": (502, "server_error"),
    "db_error": (502, "server_error"),
    "internal": (500, "server_error"),
}


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
    def from_info(cls, info: ErrorInfo) -> ApiError:
        status, type_ = STATUS.get(info.code, (500, "server_error"))
        return cls(status, info.reason, type_, info.code, retry_after=info.retry_after)

    @classmethod
    def from_result(cls, result: GenerateResult) -> ApiError:
        """A finished result that is not a success (cancelled, expired, stale, ...)."""
        if result.error is not None:
            return cls.from_info(result.error)
        code: ErrorCode = result.status if result.status in STATUS else "internal"
        return cls.from_info(ErrorInfo(code=code, reason=f"request {result.status}"))

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
