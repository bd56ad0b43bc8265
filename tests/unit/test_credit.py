"""The router's credit ledger: what a dispatch holds, when it comes back (its result heard,
read back from RES, taken twice, or the backstop), the heartbeat discount, and what it
reads of a message on `res.>`."""

from __future__ import annotations

import msgpack
import pytest

from switchyard.codec import encode
from switchyard.ids import id_time, new_id
from switchyard.messages.fleet import WorkerHeartbeat
from switchyard.messages.inference import GenerateResult, Route, Usage
from switchyard.messages.sql import SqlAnswer
from switchyard.scheduling.admission import Admission
from switchyard.scheduling.credit import (
    CLOCK_SLACK,
    MIN_BACKSTOP,
    Ledger,
    ResultView,
    backstop,
    read_result,
)
from switchyard.scheduling.policy import Policies, TenantPolicy

pytestmark = pytest.mark.unit

MAX_BYTES = 8 * 1024 * 1024
SLOTS, PER_SLOT = 2, 2  # a worker's credit: 4


class Clock:
    def __init__(self, now: float = 10_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ledger(clock: Clock) -> Ledger:
    return Ledger(clock, PER_SLOT, backstop(60.0))


def heartbeat(at: float, queued: int = 0, worker: str = "w1") -> WorkerHeartbeat:
    return WorkerHeartbeat(worker=worker, pool="p", engine="sim", at=at, slots=SLOTS,
                           queued=queued)  # fmt: skip


def result(request_id: str, used: int = 3, worker: str = "w1", finished: float = 1.0) -> ResultView:
    view = read_result(encode(generate_result(request_id, used, worker, finished)), MAX_BYTES)
    assert view is not None
    return view


def generate_result(request_id: str, used: int, worker: str, finished: float) -> GenerateResult:
    return GenerateResult(
        tenant="acme", request_id=request_id, workload="llm", status="ok", text="hi",
        usage=Usage(prompt_tokens=10, completion_tokens=used), worker=worker,
        route=Route(pool="p", created_at=max(0.0, finished - 1), finished_at=finished),
    )  # fmt: skip


def credit(ledger: Ledger, hb: WorkerHeartbeat) -> int:
    return ledger.loads("p", [hb])[hb.worker].credit


def send(ledger: Ledger, request_id: str, worker: str = "w1", max_tokens: int = 100) -> None:
    ledger.dispatch(request_id, "p", worker, "acme", max_tokens, tokens=50.0)


# -- what a dispatch holds, and its result ------------------------------------------------


def test_a_dispatch_holds_credit_and_load_until_its_result_releases_it(
    ledger: Ledger, clock: Clock
) -> None:
    hb = heartbeat(at=clock.now)
    send(ledger, "r1")
    send(ledger, "r2")
    load = ledger.loads("p", [hb])["w1"]
    assert (load.credit, load.load) == (SLOTS * PER_SLOT - 2, 100.0)
    released = ledger.take(result("r1", used=7, finished=clock.now + 1), live=True)
    assert released is not None
    assert (released.request_id, released.used) == ("r1", 7)
    assert (released.dispatch.tenant, released.dispatch.max_tokens) == ("acme", 100)
    load = ledger.loads("p", [hb])["w1"]
    assert (load.credit, load.load) == (SLOTS * PER_SLOT - 1, 50.0)
    assert "r1" not in ledger and "r2" in ledger


def test_another_pools_dispatches_hold_nothing_here(ledger: Ledger, clock: Clock) -> None:
    ledger.dispatch("r1", "other", "w1", "acme", 100, tokens=50.0)
    load = ledger.loads("p", [heartbeat(at=clock.now)])["w1"]
    assert (load.credit, load.load) == (SLOTS * PER_SLOT, 0.0)


def test_a_result_for_no_dispatch_here_releases_nothing(ledger: Ledger) -> None:
    """Another router's request, or one this router never dispatched."""
    assert ledger.take(result("elsewhere"), live=True) is None


def test_a_failed_publish_holds_nothing(ledger: Ledger, clock: Clock) -> None:
    send(ledger, "r1")
    ledger.undispatch("r1")
    ledger.undispatch("r1")  # twice: a no-op
    assert "r1" not in ledger
    assert credit(ledger, heartbeat(at=clock.now)) == SLOTS * PER_SLOT


def test_a_result_taken_twice_releases_once(ledger: Ledger, clock: Clock) -> None:
    """Heard, then read back from RES after a reconnect (or published twice: a patient
    publish retried after its first try was stored is heard twice on core NATS)."""
    send(ledger, "r1")
    assert ledger.take(result("r1", finished=clock.now + 1), live=True) is not None
    assert ledger.take(result("r1", finished=clock.now + 1), live=False) is None
    assert ledger.take(result("r1", finished=clock.now + 1), live=True) is None


# -- the heartbeat discount --------------------------------------------------------------


def test_the_heartbeat_discount_frees_a_slot_when_its_result_arrives(
    ledger: Ledger, clock: Clock
) -> None:
    """The heartbeat says the worker holds 4 (its credit, others' requests too); a result
    it published after that heartbeat frees a slot now, not a heartbeat later."""
    hb = heartbeat(at=clock.now, queued=4)
    assert credit(ledger, hb) == 0
    ledger.take(result("others", finished=hb.at + 0.1), live=True)
    assert credit(ledger, hb) == 1


def test_the_heartbeat_discount_ends_at_the_next_heartbeat(ledger: Ledger, clock: Clock) -> None:
    """A heartbeat after the result no longer counts it in `queued`: discounting it again
    would hand out credit the worker does not have."""
    ledger.take(result("r1", finished=clock.now + 0.1), live=True)
    assert credit(ledger, heartbeat(at=clock.now, queued=4)) == 1
    assert credit(ledger, heartbeat(at=clock.now + 0.2, queued=4)) == 0
    # ...and the discount is gone for good, even if an older heartbeat is looked at again.
    assert credit(ledger, heartbeat(at=clock.now, queued=4)) == 0


def test_a_result_before_the_heartbeat_is_no_discount(ledger: Ledger, clock: Clock) -> None:
    ledger.take(result("r1", finished=clock.now - 0.1), live=True)
    assert credit(ledger, heartbeat(at=clock.now, queued=4)) == 0


def test_a_result_published_twice_is_discounted_once(ledger: Ledger, clock: Clock) -> None:
    hb = heartbeat(at=clock.now, queued=4)
    for _ in range(2):
        ledger.take(result("r1", finished=hb.at + 0.1), live=True)
    assert credit(ledger, hb) == 1


def test_a_result_read_back_is_no_discount(ledger: Ledger, clock: Clock) -> None:
    """Read back from RES (not heard as published): only its own dispatch's credit comes
    back, not a slot of the worker's heartbeat."""
    hb = heartbeat(at=clock.now, queued=4)
    ledger.take(result("others", finished=hb.at + 0.1), live=False)
    assert credit(ledger, hb) == 0


def test_the_discount_is_per_worker(ledger: Ledger, clock: Clock) -> None:
    ledger.take(result("r1", worker="w2", finished=clock.now + 0.1), live=True)
    assert credit(ledger, heartbeat(at=clock.now, queued=4)) == 0
    assert credit(ledger, heartbeat(at=clock.now, queued=4, worker="w2")) == 1


def test_held_is_the_larger_of_what_was_sent_and_the_heartbeat(
    ledger: Ledger, clock: Clock
) -> None:
    """Dispatches since the heartbeat count until the heartbeat catches up: a stale
    `queued` of 0 does not hand out the credit they hold."""
    for rid in ("r1", "r2", "r3"):
        send(ledger, rid)
    assert credit(ledger, heartbeat(at=clock.now, queued=0)) == SLOTS * PER_SLOT - 3
    assert credit(ledger, heartbeat(at=clock.now, queued=4)) == 0


# -- results missed during a reconnect, read back ----------------------------------------


def test_results_missed_during_a_reconnect_are_read_back_from_the_oldest_dispatch(
    ledger: Ledger, clock: Clock
) -> None:
    assert ledger.missed_since() is None  # nothing held: nothing to read
    send(ledger, "old")
    clock.now += 30
    send(ledger, "new")
    assert ledger.missed_since() == clock.now - 30 - CLOCK_SLACK
    # RES read back: one result heard before the cut (taken again), the two missed ones.
    taken = [ledger.take(result(rid), live=False) for rid in ("elsewhere", "new", "old")]
    assert [r.request_id if r else None for r in taken] == [None, "new", "old"]
    assert not ledger.outstanding
    assert ledger.missed_since() is None


# -- a request dispatched again after its answer -----------------------------------------


def test_a_duplicate_dispatch_takes_its_earlier_result(ledger: Ledger, clock: Clock) -> None:
    """Its result was published (and heard, for no dispatch) before it was dispatched
    again: WORK acks the second dispatch as a duplicate and nothing runs, so the result is
    read from RES, from its request's creation, and releases the second dispatch."""
    request_id = new_id(clock.now - 20)
    assert ledger.take(result(request_id, used=5), live=True) is None  # the first answer
    send(ledger, request_id)  # dispatched again
    since = ledger.earlier_since(request_id)
    assert since == id_time(request_id) - CLOCK_SLACK
    assert since < clock.now - 20  # before the earlier result can have been published
    released = ledger.take(result(request_id, used=5), live=False)
    assert released is not None and released.used == 5
    assert request_id not in ledger


# -- the backstop ------------------------------------------------------------------------


def test_the_backstop_is_ten_queue_waits_and_never_under_ten_minutes() -> None:
    assert backstop(5.0) == MIN_BACKSTOP == 600.0
    assert backstop(120.0) == 1200.0


def test_the_backstop_releases_a_dispatch_never_heard_charged_its_max_tokens(
    ledger: Ledger, clock: Clock
) -> None:
    send(ledger, "lost", max_tokens=100)
    clock.now += 300
    send(ledger, "young")
    clock.now += ledger.backstop - 300
    assert ledger.expire() == []  # `lost` is exactly at the backstop: not yet
    clock.now += 1
    [expired] = ledger.expire()
    assert (expired.request_id, expired.used, expired.dispatch.max_tokens) == ("lost", 100, 100)
    assert "lost" not in ledger and "young" in ledger
    assert credit(ledger, heartbeat(at=clock.now)) == SLOTS * PER_SLOT - 1
    assert ledger.expire() == []  # released once
    # Its result, heard after all, releases nothing again.
    assert ledger.take(result("lost"), live=False) is None


def test_a_release_charges_the_tenant_what_it_used(ledger: Ledger, clock: Clock) -> None:
    """What a tenant owes, as the router applies a release: a result refunds its unused
    output tokens and frees its concurrency slot; the backstop frees the slot and refunds
    nothing. (The admission's clock stands still, so no bucket refills meanwhile.)"""
    policies = Policies(default=TenantPolicy(itpm=10_000, otpm=1_000, max_concurrency=2))
    admission = Admission(policies, Clock())
    for rid in ("heard", "lost"):
        assert admission.admit("acme", rid, 10, 100, 0).ok
        admission.dispatched(rid)
        send(ledger, rid, max_tokens=100)

    def standing() -> tuple[int, float]:
        [usage] = admission.usage(Clock().now)
        return usage.inflight, usage.output_used

    assert standing() == (2, 200)
    heard = ledger.take(result("heard", used=30), live=True)
    assert heard is not None
    admission.finished(heard.request_id, heard.used)
    assert standing() == (1, 130)
    clock.now += ledger.backstop + 1
    [lost] = ledger.expire()
    admission.finished(lost.request_id, lost.used)
    assert standing() == (0, 130)


# -- what is read of a message on res.> ---------------------------------------------------


def test_a_sql_answer_on_res_is_passed_over() -> None:
    """`res.sql.<t>` carries SqlAnswers (their rows too) beside model calls' results."""
    answer = SqlAnswer(
        tenant="acme", request_id=new_id(), status="ok", path="generated", question="how many?",
        sql="SELECT 1", columns=["n"], rows=[[i] for i in range(1000)],
    )  # fmt: skip
    assert read_result(encode(answer), MAX_BYTES) is None


def test_a_result_with_fields_this_build_does_not_know_reads_the_same() -> None:
    fields = generate_result("r1", 9, "w1", 5.0).model_dump(mode="python")
    fields["actions"] = [{"type": "tap", "x": 1, "y": 2}]
    fields["thought"] = "tap the button"
    fields["usage"]["reasoning_tokens"] = 4
    view = read_result(msgpack.packb(fields, use_bin_type=True), MAX_BYTES)
    assert view is not None
    assert (view.request_id, view.worker, view.usage.completion_tokens) == ("r1", "w1", 9)
    assert view.route is not None and view.route.finished_at == 5.0


def test_a_result_without_worker_or_route_releases_without_a_discount(
    ledger: Ledger, clock: Clock
) -> None:
    """A router's own refusals carry no worker; one with no route says no finish time."""
    bare = GenerateResult(tenant="acme", request_id="r1", workload="llm", status="error")
    view = read_result(encode(bare), MAX_BYTES)
    assert view is not None and view.worker is None and view.usage.completion_tokens == 0
    send(ledger, "r1")
    released = ledger.take(view, live=True)
    assert released is not None and released.used == 0
    assert credit(ledger, heartbeat(at=clock.now - 1, queued=4)) == 0


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1garbage", msgpack.packb({"kind": "result"}), msgpack.packb([1, 2]),
     msgpack.packb({"v": 99, "kind": "result", "request_id": "r1"}), b"x" * (MAX_BYTES + 1)],
    ids=["empty", "not-msgpack", "no-request-id", "not-a-map", "other-version", "oversized"],
)  # fmt: skip
def test_what_is_not_a_result_reads_as_none(data: bytes) -> None:
    assert read_result(data, MAX_BYTES) is None


# -- a prefill stage handed off (#39) -------------------------------------------------------


def test_a_handoff_frees_the_prefill_workers_credit_and_keeps_nothing_else(
    ledger: Ledger, clock: Clock
) -> None:
    """The prefill stage's dispatch is released as a result would release it, and the
    request's decode stage, dispatched next under the same id, holds its own worker."""
    prefill, decode = heartbeat(at=clock.now, worker="p1"), heartbeat(at=clock.now, worker="d1")
    send(ledger, "r1", worker="p1")
    assert credit(ledger, prefill) == SLOTS * PER_SLOT - 1
    ledger.handed_off("r1", "p1", clock.now + 0.5)
    assert "r1" not in ledger and credit(ledger, prefill) == SLOTS * PER_SLOT
    send(ledger, "r1", worker="d1")
    assert credit(ledger, decode) == SLOTS * PER_SLOT - 1
    released = ledger.take(result("r1", used=9, worker="d1", finished=clock.now + 1), live=True)
    assert released is not None and (released.dispatch.worker, released.used) == ("d1", 9)


def test_a_handoff_heard_after_its_decode_went_out_releases_nothing_of_it(
    ledger: Ledger, clock: Clock
) -> None:
    """A decode stage redelivered after its dispatch: the decode dispatch keeps its credit."""
    ledger.dispatch("r1", "p", "d1", "acme", 100, tokens=50.0, decode=True)
    assert ledger.decoding("r1")
    ledger.handed_off("r1", "p1", clock.now)
    assert "r1" in ledger and ledger.outstanding["r1"].worker == "d1"


def test_a_prefill_run_again_elsewhere_releases_the_first_dispatch(
    ledger: Ledger, clock: Clock
) -> None:
    """The prefill worker died; its partition moved and another worker ran the prefill and
    handed off: the dispatch (to the dead one) is released all the same, and the decode
    stage is not taken for one already out (the drill found a request lost that way)."""
    send(ledger, "r1", worker="p-dead")
    assert not ledger.decoding("r1")
    ledger.handed_off("r1", "p-heir", clock.now)
    assert "r1" not in ledger


def test_a_handoff_counts_against_the_prefill_workers_last_heartbeat(
    ledger: Ledger, clock: Clock
) -> None:
    """The prefill worker's heartbeat still counts a stage it handed off since: discounted,
    as a result it published would be."""
    hb = heartbeat(at=clock.now, queued=SLOTS * PER_SLOT, worker="p1")
    assert credit(ledger, hb) == 0
    ledger.handed_off("others", "p1", hb.at + 0.1)
    assert credit(ledger, hb) == 1
