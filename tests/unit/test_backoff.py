"""Backoff with jitter, and which JetStream errors a patient publish tries again.

The errors a real server can be made to send are provoked in
`tests/integration/test_publish_retry.py`; here, beside those, each decided code of
`JS_ERRORS` is raised by a stand-in attempt (fault injection), for the ones no test
server sends on demand (a meta leader's election, a failed store, a defined code the
server does not send yet).
"""

from __future__ import annotations

import random

import nats.errors
import nats.js.errors
import pytest

from switchyard.backoff import Backoff
from switchyard.bus.publish import JS_ERRORS, patiently, transient

pytestmark = pytest.mark.unit

QUICK = Backoff(first=0.001, cap=0.004)


def test_each_wait_lies_between_half_and_all_of_a_doubling_ceiling() -> None:
    backoff = Backoff(first=0.1, cap=2.0, rng=random.Random(7))
    for attempt, ceiling in enumerate([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]):
        assert backoff.ceiling(attempt) == pytest.approx(ceiling)
        waits = [backoff.delay(attempt) for _ in range(200)]
        assert min(waits) >= ceiling / 2 and max(waits) <= ceiling
        # Jittered: the draws spread over the range, not one value for everyone.
        assert max(waits) - min(waits) > ceiling / 4


def test_two_processes_retrying_together_do_not_wait_alike() -> None:
    a, b = Backoff(0.5, 30.0, random.Random(1)), Backoff(0.5, 30.0, random.Random(2))
    assert [a.delay(n) for n in range(5)] != [b.delay(n) for n in range(5)]


def test_a_huge_attempt_count_stays_at_the_cap() -> None:
    assert Backoff(0.5, 30.0).delay(10_000) <= 30.0


@pytest.mark.parametrize(("first", "cap"), [(0.0, 1.0), (2.0, 1.0), (-1.0, 1.0)])
def test_a_backoff_that_cannot_wait_is_refused(first: float, cap: float) -> None:
    with pytest.raises(ValueError, match="first <= cap"):
        Backoff(first, cap)


def _api_error(code: int, err_code: int | None) -> nats.js.errors.APIError:
    """What nats-py raises for a JetStream error response of that code."""
    try:
        nats.js.errors.APIError.from_error(
            {"code": code, "err_code": err_code, "description": "injected"}
        )
    except nats.js.errors.APIError as exc:
        return exc
    raise AssertionError("from_error always raises")


HTTP_CODE = {10158: 409, 10167: 429, 10008: 503, 10023: 503, 10077: 503, 10163: 503,
             10076: 503, 10039: 503}  # fmt: skip


def test_every_decided_code_is_in_the_table_with_its_status() -> None:
    assert set(JS_ERRORS) == set(HTTP_CODE)


@pytest.mark.parametrize("err_code", sorted(JS_ERRORS))
async def test_a_decided_code_is_tried_again_or_raised_at_once(err_code: int) -> None:
    error = _api_error(HTTP_CODE[err_code], err_code)
    calls = 0

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise error
        return "stored"

    if JS_ERRORS[err_code]:
        assert await patiently(attempt, 5.0, what="t", backoff=QUICK) == "stored"
        assert calls == 3
    else:
        with pytest.raises(type(error)):
            await patiently(attempt, 5.0, what="t", backoff=QUICK)
        assert calls == 1  # a configuration error is not waited on


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (_api_error(503, None), True),  # a bare 503 status (no code): unavailable
        (_api_error(503, 10999), True),  # a 503 not in the table: the server's "unavailable"
        (_api_error(400, 10071), False),  # wrong last sequence: a KV conflict, not a moment
        (_api_error(404, 10059), False),  # stream not found
        (_api_error(500, 10041), False),  # a Raft error the table does not know
        (nats.errors.TimeoutError(), True),
        (nats.errors.NoRespondersError(), True),
        (nats.js.errors.NoStreamResponseError(), True),
        (nats.errors.ConnectionReconnectingError(), True),
        (ValueError("a bug"), False),
    ],
)
def test_what_is_not_in_the_table(error: BaseException, expected: bool) -> None:
    assert transient(error) is expected


async def test_patience_runs_out_with_the_last_error() -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise _api_error(409, 10158)

    with pytest.raises(nats.js.errors.APIError) as raised:
        await patiently(attempt, 0.05, what="t", backoff=QUICK)
    assert raised.value.err_code == 10158 and calls > 3


async def test_no_patience_raises_a_transient_error_at_once() -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise nats.errors.TimeoutError

    with pytest.raises(nats.errors.TimeoutError):
        await patiently(attempt, 0.0, what="t", backoff=QUICK)
    assert calls == 1
