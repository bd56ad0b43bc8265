"""Superseded and stale agent steps on real NATS: preprocessor, router and `sim` worker.

- A newer step of a session supersedes its older step still queued in the router,
  dispatched but not yet started by the worker, or on the engine without a token out
  (aborted there): the older is answered `superseded` (on RES and its inbox, exactly
  once), the newer is served.
- An answer ready only after its frame outlived its budget is answered `stale`.
- A phone whose clock is 5 s fast or slow: its fresh frames are served and its stale
  ones answered `stale` (the preprocessor estimates the clock's offset per session).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from nats.aio.msg import Msg
from prometheus_client import REGISTRY

from services.router.router import Router
from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.codec import decode
from switchyard.envelope import Envelope
from switchyard.ids import new_id
from switchyard.messages.agent import AgentStep, RawFrame, StepOptions
from switchyard.messages.inference import (
    ChatMessage,
    GenerateRequest,
    GenerateResult,
    Sampling,
    TokenFrame,
)
from tests.integration.test_agent_path import png_frame
from tests.support.edge import edge_in_process, write_keys
from tests.support.fleet import (
    preprocessor_in_process,
    provision_pool,
    router_in_process,
    wait_for_pool,
    worker_in_process,
)
from tests.support.poll import until

BLOCKER_TOKENS = 300  # ~4 s of decode at the sim's A100 calibration, delay scale 1


@pytest.fixture
def sim_one_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """One engine slot at real-time speed: a long request keeps the worker busy."""
    monkeypatch.setenv("SY_SIM_MAX_NUM_SEQS", "1")
    monkeypatch.setenv("SY_SIM_DELAY_SCALE", "1")


@contextlib.asynccontextmanager
async def agent_fleet(
    nats_url: str, pool: str, *, credit_per_slot: int = 2, worker_credit: int = 4
) -> AsyncIterator[tuple[Router, str]]:
    """Router, one `sim` worker and the preprocessor for a private agent `pool`."""
    async with contextlib.AsyncExitStack() as stack:
        router = await stack.enter_async_context(
            router_in_process(nats_url, partitions=4, pools=[pool], rebalance_interval=0.2,
                              credit_per_slot=credit_per_slot)
        )  # fmt: skip
        worker = f"{pool}-w0"
        await stack.enter_async_context(
            worker_in_process(nats_url, pool=pool, engine="sim", assignment="kv",
                              worker_id=worker, credit=worker_credit)
        )  # fmt: skip
        await stack.enter_async_context(
            preprocessor_in_process(nats_url, agent_pool=pool, frame_procs=0)
        )
        await wait_for_pool(router.bus.js, pool, 1)
        yield router, worker


@dataclass
class Answers:
    """Everything published on `res.*.<tenant>` and on each sent message's inbox, kept
    after the first terminal frame too, so a second answer would show."""

    bus: Bus
    tenant: str
    results: dict[str, list[GenerateResult]] = field(default_factory=lambda: defaultdict(list))
    frames: dict[str, list[TokenFrame]] = field(default_factory=lambda: defaultdict(list))
    subs: list[Any] = field(default_factory=list)

    async def __aenter__(self) -> Answers:
        async def on_result(msg: Msg) -> None:
            result = decode(msg.data, GenerateResult)
            self.results[result.request_id].append(result)

        self.subs.append(await self.bus.nc.subscribe(f"res.*.{self.tenant}", cb=on_result))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for sub in self.subs:
            await sub.unsubscribe()

    async def send(self, message: Envelope, subject: str) -> None:
        """Publish `message` with a reply inbox of its own that this collects."""
        inbox = self.bus.nc.new_inbox()
        rid = message.id

        async def on_frame(msg: Msg) -> None:
            self.frames[rid].append(decode(msg.data, TokenFrame))

        self.subs.append(await self.bus.nc.subscribe(inbox, cb=on_frame))
        sent = message.model_copy(update={"reply": inbox})
        await publish(self.bus.js, subject, sent, msg_id=rid)

    def terminal(self, rid: str) -> list[TokenFrame]:
        return [f for f in self.frames[rid] if f.type in ("end", "error")]

    def answered(self, *rids: str) -> bool:
        return all(self.terminal(r) and self.results[r] for r in rids)

    def only(self, rid: str) -> GenerateResult:
        """The one answer of `rid`: one result on RES, one terminal frame carrying it."""
        assert len(self.results[rid]) == 1, self.results[rid]
        ends = self.terminal(rid)
        assert len(ends) == 1 and ends[0].type == "end" and ends[0].result is not None, ends
        assert ends[0].result == self.results[rid][0]
        return self.results[rid][0]


def step(tenant: str, session: str, k: int, *, skew: float = 0.0, age: float = 0.0,
         stale_after: float = 60.0, stamp_sent_at: bool = False) -> AgentStep:  # fmt: skip
    """Step `k` of a phone whose clock reads `skew` s more than the fleet's, for a frame
    captured `age` s ago. Its envelope's `created_at` is the phone's clock (a client
    publishing on the bus stamps it itself), `frame_ts` too."""
    now = time.time() + skew
    return AgentStep(
        tenant=tenant, session=session, step=k, created_at=now, frame_ts=now - age,
        sent_at=now if stamp_sent_at else None, stale_after=stale_after,
        frames=[RawFrame(data=png_frame(k, (320, 180)), mime="image/png")],
        goal="collect the daily reward", options=StepOptions(max_tokens=32),
    )  # fmt: skip


def late_answers() -> float:
    """The in-process worker's count of answers withheld as stale after the engine ran."""
    return REGISTRY.get_sample_value("sy_worker_late_answers_total") or 0.0


def blocker(tenant: str, pool: str, session: str) -> GenerateRequest:
    """A long request in `session`: its worker's one slot, and (same session, same
    partition) the WORK partition the session's steps wait on."""
    return GenerateRequest(
        tenant=tenant, workload="llm", pool=pool, session=session,
        messages=[ChatMessage(role="user", content="a long story")],
        sampling=Sampling(max_tokens=BLOCKER_TOKENS), prompt_tokens=20,
    )  # fmt: skip


async def test_a_newer_step_supersedes_the_older_one_queued_in_the_router(
    bus: Bus, nats_url: str, unique: str, sim_one_slot: None
) -> None:
    pool, tenant, session = f"q{unique}", f"t{unique}", f"ep-{unique}"
    await provision_pool(bus.js, pool)
    # One request per worker slot: behind the blocker, both steps wait in the router.
    async with (
        agent_fleet(nats_url, pool, credit_per_slot=1) as (router, worker),
        Answers(bus, tenant) as answers,
    ):
        busy = blocker(tenant, pool, session)
        await answers.send(busy, subjects.req("llm", tenant))
        await until(lambda: busy.id in router.ledger, timeout=30, what="blocker out")
        older, newer = step(tenant, session, 1), step(tenant, session, 2)
        await answers.send(older, subjects.agent_in(tenant))
        await until(lambda: router.queue.get(older.id) is not None, timeout=30,
                    what="the older step queued behind the blocker")  # fmt: skip
        await answers.send(newer, subjects.agent_in(tenant))
        await until(lambda: answers.answered(older.id), timeout=30, what="older answered")
        # Answered while the blocker still runs: by the router, not after a wait.
        assert busy.id in router.ledger
        await until(lambda: answers.answered(busy.id, newer.id), timeout=60,
                    what="the blocker and the newer step answered")  # fmt: skip
        await asyncio.sleep(0.5)  # a window for a second answer to show (none must)

    superseded = answers.only(older.id)
    assert superseded.status == "superseded" and superseded.worker is None
    assert superseded.error is not None and superseded.error.code == "superseded"
    assert "step 1 superseded by step 2" in superseded.error.reason
    assert superseded.frame_ts == older.frame_ts and superseded.usage.prompt_tokens == 0
    served = answers.only(newer.id)
    assert served.status == "ok" and served.worker == worker and served.text
    assert answers.only(busy.id).status == "ok"


def engine_waiting() -> float:
    """Requests the in-process worker's engine holds without a slot (its vLLM gauge)."""
    return sum(
        sample.value
        for family in REGISTRY.collect() if family.name == "vllm:num_requests_waiting"
        for sample in family.samples
    )  # fmt: skip


async def older_then_newer(
    bus: Bus, nats_url: str, pool: str, *, worker_credit: int, older_on_engine: bool
) -> GenerateResult:
    """A blocker holds the worker's one slot; step 1 of its session is dispatched behind it
    (two requests per slot), then step 2 arrives. With `worker_credit` 1 the worker pulls
    one message per partition at once, so step 1 waits in WORK; with more it reaches the
    engine and waits there (`older_on_engine`). Returns step 1's one answer (`superseded`),
    once all three are answered and no second answer showed."""
    tenant, session = f"t{pool}", f"ep-{pool}"
    await provision_pool(bus.js, pool)
    async with (
        agent_fleet(nats_url, pool, credit_per_slot=2, worker_credit=worker_credit) as fleet,
        Answers(bus, tenant) as answers,
    ):
        router, worker = fleet
        busy = blocker(tenant, pool, session)
        await answers.send(busy, subjects.req("llm", tenant))
        await until(lambda: busy.id in router.ledger, timeout=30, what="blocker out")
        older, newer = step(tenant, session, 1), step(tenant, session, 2)
        await answers.send(older, subjects.agent_in(tenant))
        await until(lambda: older.id in router.ledger, timeout=30,
                    what="the older step dispatched")  # fmt: skip
        if older_on_engine:
            await until(lambda: engine_waiting() >= 1, timeout=30,
                        what="the older step waiting on the engine for a slot")  # fmt: skip
        await answers.send(newer, subjects.agent_in(tenant))
        if older_on_engine:
            await until(lambda: answers.answered(older.id), timeout=30, what="older answered")
            assert busy.id in router.ledger  # aborted at once, not after the blocker
        else:
            await until(lambda: router.queue.get(newer.id) is not None, timeout=30,
                        what="the newer step queued (no credit left)")  # fmt: skip
            assert not answers.answered(older.id)  # the router did not answer it: it is out
        await until(lambda: answers.answered(busy.id, older.id, newer.id), timeout=60,
                    what="all three answered")  # fmt: skip
        await asyncio.sleep(0.5)  # a window for a second answer to show (none must)

    superseded = answers.only(older.id)
    assert superseded.status == "superseded" and superseded.worker == worker
    assert superseded.error is not None and superseded.error.code == "superseded"
    assert superseded.text == "" and superseded.usage.completion_tokens == 0
    served = answers.only(newer.id)
    assert served.status == "ok" and served.worker == worker and served.text
    assert answers.only(busy.id).status == "ok"
    return superseded


@pytest.mark.parametrize(
    ("worker_credit", "older_on_engine", "reason"),
    [
        (1, False, "before it started"),  # waiting in WORK: the engine never saw it
        (4, True, "on the engine, before it produced a token"),  # aborted there
    ],
    ids=["dispatched-not-started", "waiting-on-the-engine"],
)
async def test_a_newer_step_supersedes_the_older_one_dispatched(
    bus: Bus, nats_url: str, unique: str, sim_one_slot: None,
    worker_credit: int, older_on_engine: bool, reason: str,
) -> None:  # fmt: skip
    superseded = await older_then_newer(
        bus, nats_url, f"d{worker_credit}{unique}", worker_credit=worker_credit,
        older_on_engine=older_on_engine,
    )  # fmt: skip
    assert superseded.error is not None and reason in superseded.error.reason


async def test_an_answer_ready_after_its_frame_went_stale_is_answered_stale(
    bus: Bus, nats_url: str, unique: str, sim_one_slot: None
) -> None:
    pool, tenant = f"s{unique}", f"t{unique}"
    await provision_pool(bus.js, pool)
    late_before = late_answers()
    async with agent_fleet(nats_url, pool) as (_router, worker), Answers(bus, tenant) as answers:
        # Fresh at every check before the engine (budget 2 s), ~4 s of decode after.
        slow = GenerateRequest(
                tenant=tenant, workload="agent", pool=pool, session=f"ep-{unique}", step=0,
                messages=[ChatMessage(role="user", content="tap")], frame_ts=time.time(),
                stale_after=2.0, sampling=Sampling(max_tokens=BLOCKER_TOKENS), prompt_tokens=20,
            )  # fmt: skip
        await answers.send(slow, subjects.req("agent", tenant))
        await until(lambda: answers.answered(slow.id), timeout=60, what="answered")

    res = answers.only(slow.id)
    assert res.status == "stale" and res.worker == worker, res
    assert res.error is not None and res.error.code == "stale"
    assert "when its answer was ready" in res.error.reason
    assert res.text == ""  # no action for a screen that is gone
    assert res.usage.completion_tokens == BLOCKER_TOKENS  # the engine did run it
    assert late_answers() == late_before + 1  # counted: engine work thrown away


# -- a skewed client clock --------------------------------------------------------------

BUDGET = 5.0  # s: room for a loaded machine; the skew (5 s) alone would break it
FRESH, OLD = 0.2, 6.0  # frame ages (s): within the budget, and past it


@pytest.fixture(scope="module")
async def skew_fleet(
    nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Bus, str, str]]:
    """Router, sim worker, preprocessor and edge; yields (bus, pool, edge URL)."""
    from switchyard.bus.connection import connect
    from switchyard.config import Settings

    pool = f"k{new_id().lower()[-10:]}"
    keys = write_keys(tmp_path_factory.mktemp("skew") / "keys.yaml", {"sk-k": {"tenant": "kk"}})
    bus = await connect(Settings(nats_url=nats_url), "pytest-skew")
    await provision_pool(bus.js, pool)
    try:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(
                router_in_process(nats_url, partitions=4, pools=[pool], rebalance_interval=0.2)
            )
            await stack.enter_async_context(
                worker_in_process(nats_url, pool=pool, engine="sim", assignment="kv",
                                  worker_id=f"{pool}-w0")
            )  # fmt: skip
            await stack.enter_async_context(
                preprocessor_in_process(nats_url, agent_pool=pool, frame_procs=0)
            )
            await wait_for_pool(bus.js, pool, 1)
            url = await stack.enter_async_context(
                edge_in_process(nats_url, api_keys_file=keys, agent_pool=pool)
            )
            yield bus, pool, url
    finally:
        await bus.close()


@pytest.mark.parametrize("skew", [5.0, -5.0])
async def test_a_skewed_phone_clock_neither_drops_fresh_nor_passes_stale_frames(
    skew_fleet: tuple[Bus, str, str], skew: float
) -> None:
    bus, _pool, _url = skew_fleet
    tenant, session = "skew", f"ep-{new_id()[-8:]}"
    # Judged on the phone's clock as it stands, +5 s would pass the old frame (age 1 s)
    # and -5 s would drop the fresh one (age 5.2 s): the fleet must correct both.
    steps = [
        step(tenant, session, 0, skew=skew, age=FRESH, stale_after=BUDGET),
        step(tenant, session, 1, skew=skew, age=OLD, stale_after=BUDGET),
        step(tenant, session, 2, skew=skew, age=FRESH, stale_after=BUDGET),
    ]
    async with Answers(bus, tenant) as answers:
        for s in steps:  # one after the other, as a phone does
            await answers.send(s, subjects.agent_in(tenant))
            answered = functools.partial(answers.answered, s.id)
            await until(answered, timeout=60, what=f"step {s.step}")

    fresh0, old, fresh2 = (answers.only(s.id) for s in steps)
    assert fresh0.status == "ok" and fresh0.text, fresh0.error
    assert fresh2.status == "ok" and fresh2.text, fresh2.error
    assert old.status == "stale" and old.worker is None, old  # refused on arrival
    assert old.error is not None and "budget 5.000s" in old.error.reason
    # The measured age is the frame's true age (plus the trip), not age +- skew.
    age = float(old.error.reason.split("frame is ")[1].split("s old")[0])
    assert OLD <= age < OLD + 2.0, old.error.reason
    # The answer echoes the phone's own frame_ts, on the phone's clock, to match it.
    assert [r.frame_ts for r in (fresh0, old, fresh2)] == [s.frame_ts for s in steps]


async def test_an_http_client_with_a_slow_clock_is_served_when_it_sends_sent_at(
    skew_fleet: tuple[Bus, str, str],
) -> None:
    _bus, _pool, url = skew_fleet
    skew = -5.0

    def body(session: str, age: float, sent_at: bool) -> dict[str, Any]:
        now = time.time() + skew
        fields: dict[str, Any] = {
            "frames": [{"data": base64.b64encode(png_frame(1, (320, 180))).decode(),
                        "mime": "image/png"}],
            "session": session, "frame_ts": now - age, "stale_after": BUDGET,
            "options": {"max_tokens": 32},
        }  # fmt: skip
        return {**fields, "sent_at": now} if sent_at else fields

    auth = {"Authorization": "Bearer sk-k"}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        served = await http.post("/v1/agent/step", json=body(f"h-{new_id()[-8:]}", FRESH, True),
                                 headers=auth)  # fmt: skip
        stale = await http.post("/v1/agent/step", json=body(f"h-{new_id()[-8:]}", OLD, True),
                                headers=auth)  # fmt: skip
        # Without `sent_at` the fleet takes the client's clock as right: 5.2 s is too old.
        unknown = await http.post(
            "/v1/agent/step", json=body(f"h-{new_id()[-8:]}", FRESH, False), headers=auth
        )
    assert served.status_code == 200, served.text
    assert served.json()["status"] == "ok"
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale", stale.text
    assert unknown.status_code == 409 and unknown.json()["error"]["code"] == "stale"
