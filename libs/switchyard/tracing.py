"""W3C Trace Context (`traceparent`) for requests that cross the fleet.

A request gets its trace at the edge (the client's own `traceparent` when it sent a
valid one, a new one otherwise) and keeps the trace id everywhere: in the envelope's
`trace` field, in the `traceparent` header of every JetStream message, and in every
log line (`trace_id`), so `sy trace` finds every message of a request by its trace id
(a SQL question's model calls too). With OpenTelemetry on (`switchyard.otel`) each hop
sends onward its own span's id under the same trace id, and the sampled flag it decided.

Format (https://www.w3.org/TR/trace-context/#traceparent-header):
`00-<32 hex trace id>-<16 hex parent/span id>-<2 hex flags>`; all-zero ids are invalid.
"""

from __future__ import annotations

import os
import re

VERSION = "00"
SAMPLED = "01"
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


def _hex(n_bytes: int) -> str:
    while True:
        value = os.urandom(n_bytes).hex()
        if value.strip("0"):
            return value


def new_traceparent() -> str:
    """A new trace with a new root span, sampled."""
    return f"{VERSION}-{_hex(16)}-{_hex(8)}-{SAMPLED}"


def is_valid(value: str | None) -> bool:
    """True for a traceparent this version of the spec accepts (version `ff` is invalid)."""
    if not value:
        return False
    m = _TRACEPARENT.match(value.strip())
    return bool(m and m.group(1) != "ff" and m.group(2) != _ZERO_TRACE and m.group(3) != _ZERO_SPAN)


def continued(header: str | None) -> str | None:
    """The client's traceparent when valid (so its trace continues in ours), else None."""
    return header.strip() if header is not None and is_valid(header) else None


def accept(header: str | None) -> str:
    """The client's traceparent when valid, else a new one.

    Per the spec, an invalid header starts a new trace rather than failing the request.
    """
    return continued(header) or new_traceparent()


def trace_id(traceparent: str | None) -> str | None:
    """The 32-hex trace id of a valid traceparent, else None."""
    if traceparent is None or not is_valid(traceparent):
        return None
    return traceparent.strip().split("-")[1]
