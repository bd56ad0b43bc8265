"""W3C traceparent: what we accept from clients, what we make, and children of a trace."""

from __future__ import annotations

import pytest

from switchyard.messages.sql import SqlAsk
from switchyard.tracing import accept, is_valid, new_traceparent, trace_id

CLIENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_new_traceparents_are_valid_and_distinct() -> None:
    made = {new_traceparent() for _ in range(200)}
    assert len(made) == 200
    assert all(is_valid(t) and t.startswith("00-") and t.endswith("-01") for t in made)


@pytest.mark.parametrize(
    "bad",
    [
        None, "", "garbage", CLIENT.upper(),  # hex must be lower case
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff is invalid
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero span id
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
    ],
)  # fmt: skip
def test_an_invalid_header_starts_a_new_trace(bad: str | None) -> None:
    assert not is_valid(bad)
    made = accept(bad)
    assert is_valid(made) and made != bad


def test_a_valid_client_header_is_continued() -> None:
    assert accept(CLIENT) == CLIENT
    assert accept(f"  {CLIENT} ") == CLIENT
    assert trace_id(CLIENT) == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_every_envelope_carries_a_trace_unless_given_one() -> None:
    a, b = SqlAsk(tenant="acme", question="x"), SqlAsk(tenant="acme", question="x")
    assert is_valid(a.trace) and is_valid(b.trace) and trace_id(a.trace) != trace_id(b.trace)
    assert SqlAsk(tenant="acme", question="x", trace=CLIENT).trace == CLIENT


def test_log_lines_in_a_request_carry_its_trace_id() -> None:
    """`bind_request` puts the ids in structlog's context, which `merge_contextvars` (the
    first processor `logging.configure` installs) adds to every line logged under it."""
    import structlog

    from switchyard.logging import bind_request

    with bind_request("R1", "acme", CLIENT):
        inside = structlog.contextvars.get_contextvars()
        with bind_request("R2", "nova", None):
            nested = structlog.contextvars.get_contextvars()
        assert structlog.contextvars.get_contextvars() == inside
    assert inside["trace_id"] == trace_id(CLIENT) and inside["request_id"] == "R1"
    assert nested["trace_id"] is None and nested["tenant"] == "nova"
    assert structlog.contextvars.get_contextvars().get("request_id") is None
