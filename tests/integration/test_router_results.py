"""What a running router reads of the messages on `res.>`: a result releases its dispatch;
another workload's answer there (a `SqlAnswer` on `res.sql.<t>`, its rows too) is passed
over, neither an error nor a release; a result with fields this build does not know
still releases its dispatch."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import structlog
from structlog.testing import LogCapture

from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.codec import encode
from switchyard.ids import new_id
from switchyard.messages.inference import GenerateResult, Route, Usage
from switchyard.messages.sql import SqlAnswer
from tests.support.fleet import provision_pool, router_in_process
from tests.support.poll import until

TENANT = "acme"


@pytest.fixture
def router_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[LogCapture]:
    """Every line the router module logs during the test."""
    capture = LogCapture()
    monkeypatch.setattr(
        "services.router.router.log", structlog.wrap_logger(None, processors=[capture])
    )
    yield capture


def dispatched(router: Any, request_id: str) -> None:
    """A request admitted and dispatched to a worker, as the router books it."""
    assert router.admission.admit(TENANT, request_id, 10, 100, 0).ok
    router.admission.dispatched(request_id)
    router.ledger.dispatch(request_id, "sql", "w1", TENANT, 100, 50.0)


async def listening(bus: Bus, router: Any) -> None:
    """Until the router hears `res.>` (it subscribes once its fleet view is loaded): a
    probe's result, published again until it releases the probe's dispatch."""
    probe = new_id()
    dispatched(router, probe)

    async def released() -> bool:
        await bus.nc.publish(subjects.res("sql", TENANT), encode(model_call_result(probe)))
        await asyncio.sleep(0.05)
        return probe not in router.ledger

    await until(released, timeout=10, what="the router listening on res.>")


def model_call_result(request_id: str) -> GenerateResult:
    return GenerateResult(
        tenant=TENANT, request_id=request_id, workload="sql", status="ok", text="SELECT 1",
        usage=Usage(prompt_tokens=10, completion_tokens=4), worker="w1",
        route=Route(pool="sql", created_at=1.0, finished_at=2.0),
    )  # fmt: skip


async def test_a_sql_answer_on_res_is_passed_over_and_a_result_still_releases(
    bus: Bus, unique: str, nats_url: str, router_logs: LogCapture
) -> None:
    """The SqlAnswer carries the id of a dispatch the router holds (the worst case: a
    reader going by `request_id` alone would release it): it stays held, and the model
    call's result published after it on the same subject releases its own dispatch (so
    the router heard the answer first, and went on)."""
    pool = f"q{unique}"
    await provision_pool(bus.js, pool)
    async with router_in_process(nats_url, pools=[pool]) as router:
        await listening(bus, router)
        answer_id, call_id = new_id(), new_id()
        dispatched(router, answer_id)
        dispatched(router, call_id)
        answer = SqlAnswer(
            tenant=TENANT, request_id=answer_id, status="ok", path="generated",
            question="how many players?", sql="SELECT 1", columns=["n"],
            rows=[[i] for i in range(5000)],
        )  # fmt: skip
        await publish(bus.js, subjects.res("sql", TENANT), answer, msg_id=f"res-{answer_id}")
        result = model_call_result(call_id)
        await publish(bus.js, subjects.res("sql", TENANT), result, msg_id=f"res-{call_id}")
        await until(lambda: call_id not in router.ledger, timeout=10, what="the result taken")
        assert answer_id in router.ledger
        assert router.admission.inflight(TENANT) == 1  # the answer's dispatch, still held
    noisy = [e for e in router_logs.entries if e["log_level"] in ("warning", "error")]
    assert noisy == []


async def test_a_result_with_fields_this_build_does_not_know_releases_its_dispatch(
    bus: Bus, unique: str, nats_url: str
) -> None:
    """A newer worker's result (here `actions` and `thought` beside the fields of today)."""
    pool = f"q{unique}"
    await provision_pool(bus.js, pool)
    async with router_in_process(nats_url, pools=[pool]) as router:
        await listening(bus, router)
        request_id = new_id()
        dispatched(router, request_id)
        fields = model_call_result(request_id).model_dump(mode="python")
        fields.update(actions=[{"type": "tap", "x": 10, "y": 20}], thought="tap it")
        await bus.js.publish(
            subjects.res("sql", TENANT), msgpack.packb(fields, use_bin_type=True),
            headers={"Nats-Msg-Id": f"res-{request_id}"},
        )  # fmt: skip
        await until(lambda: request_id not in router.ledger, timeout=10, what="released")
        assert router.admission.inflight(TENANT) == 0
