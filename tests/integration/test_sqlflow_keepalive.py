"""A question's keepalives on a real NATS and MariaDB: while its model call is slow, sqlflow's
`StageProgress` frames keep an asker with a short idle timeout listening until the answer;
once sqlflow stops mid-question, that same idle timeout fires.

The model is a stand-in the test drives (no router, no worker): it takes the intent call
off `req.sql.acme` and answers it on the call's reply inbox, as a worker would, only when
the asker has been kept waiting several idle timeouts. Every wait is on a frame, none on
the clock."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.tokenstream import TokenStreamWriter
from switchyard.codec import decode
from switchyard.errors import StreamTimeout
from switchyard.messages.inference import GenerateRequest, GenerateResult
from switchyard.messages.sql import SqlAnswer, SqlAsk, StageEvent, StageProgress
from switchyard.text2sql.client import stream_answer
from tests.support.fleet import provision_pool
from tests.support.sqlenv import SqlEnv
from tests.support.sqlflow import sqlflow_in_process

KEEPALIVE = 0.2  # sqlflow's keepalive_interval here
IDLE = 1.0  # the asker's idle timeout: five keepalives, far less than the model call
HELD = 3 * IDLE  # how long the stand-in model holds the call before it answers


@contextlib.asynccontextmanager
async def model_calls(bus: Bus, question: str) -> AsyncIterator[asyncio.Queue[GenerateRequest]]:
    """The model calls sqlflow makes for `question` (another test's leftover question, read
    by this sqlflow, is not this test's), as the router would get them; and, after, their
    requests taken out of REQ, so that no later router schedules them."""
    calls: asyncio.Queue[GenerateRequest] = asyncio.Queue()
    seen: list[GenerateRequest] = []

    async def on_call(msg: Msg) -> None:
        request = decode(msg.data, GenerateRequest)
        if request.tenant == "acme" and question in str(request.messages or ""):
            seen.append(request)
            calls.put_nowait(request)

    sub = await bus.nc.subscribe(subjects.req("sql", "acme"), cb=on_call)
    try:
        yield calls
    finally:
        await sub.unsubscribe()
        for request in seen:
            await forget(bus, "REQ", subjects.req("sql", "acme"), request.id)


async def forget(bus: Bus, stream: str, subject: str, message_id: str) -> None:
    """Delete `message_id` from `stream` if it is the last message on `subject` (tests run
    one at a time: nothing was published there since)."""
    with contextlib.suppress(NotFoundError):
        last = await bus.js.get_last_msg(stream, subject)
        if last.headers and last.headers.get("Nats-Msg-Id") == message_id and last.seq:
            await bus.js.delete_msg(stream, last.seq)


def result(request: GenerateRequest, text: str) -> GenerateResult:
    """A worker's result of a one-token constrained choice."""
    return GenerateResult(tenant=request.tenant, request_id=request.id, workload="sql",
                          status="ok", text=text, finish_reason="stop")  # fmt: skip


def question() -> str:
    # No view, column or metric in it: the model's `chit_chat` stands, and no SQL follows.
    return f"hello there {uuid.uuid4().hex[:8]}, how are you doing today?"


async def test_a_slow_model_call_keeps_the_asker_listening_until_the_answer(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, tmp_path: Path
) -> None:
    await provision_pool(bus.js, "sql")  # the shared streams: INGRESS, REQ, RES, AUDIT
    asked = question()
    ask = SqlAsk(tenant="acme", question=asked, no_cache=True)
    items: list[StageEvent | StageProgress | SqlAnswer] = []
    async with (
        model_calls(bus, asked) as calls,
        sqlflow_in_process(nats_url, sqlenv, tmp_path / "index", keepalive_interval=KEEPALIVE,
                           summary=False),
        contextlib.aclosing(stream_answer(bus, ask, idle_timeout=IDLE)) as stream,
    ):  # fmt: skip
        try:
            request: GenerateRequest | None = None
            writer: TokenStreamWriter | None = None
            async for item in stream:
                items.append(item)
                if isinstance(item, SqlAnswer):
                    break
                if not isinstance(item, StageProgress) or item.stage != "intent":
                    continue
                if request is None and item.seconds >= HELD:
                    # Kept waiting three idle timeouts by now: answer, the token first, and
                    # the result only once a keepalive has told the asker of that token.
                    request = calls.get_nowait()
                    assert request.reply, "sqlflow's model call must carry a reply inbox"
                    writer = TokenStreamWriter(bus.nc, request.reply)
                    await writer.delta("chit_chat", tokens=1)
                elif request is not None and writer is not None and item.tokens == 1:
                    await writer.end(result(request, "chit_chat"))
        finally:
            await forget(bus, "INGRESS", subjects.sql_in("acme"), ask.id)
    answer = items[-1]
    assert isinstance(answer, SqlAnswer), items[-3:]
    assert (answer.status, answer.path, answer.intent) == ("ok", "no_sql", "chit_chat"), answer
    progress = [i for i in items if isinstance(i, StageProgress)]
    # the model call lasted three idle timeouts; the asker, idle for one at most, heard on
    held = [p for p in progress if p.stage == "intent"]
    assert held and held[-1].seconds >= HELD and answer.stages["intent"] >= HELD, held[-1:]
    assert all(p.request_id == ask.id and p.tenant == "acme" for p in progress)
    assert [p.tokens for p in held][:1] == [0], held[:1]  # nothing streamed yet: 0, not None
    assert held[-1].tokens == 1  # the delta the stand-in streamed, counted
    elapsed = [p.elapsed for p in progress]
    assert elapsed == sorted(elapsed) and len(progress) >= HELD / KEEPALIVE / 2, elapsed
    # the keepalives are no stages: the answer's stages are those of the stage events
    stages = [i.stage for i in items if isinstance(i, StageEvent)]
    assert stages == ["intent"] and set(answer.stages) == {"intent"}, stages


async def test_a_stopped_orchestrator_is_silence_and_the_idle_timeout_fires(
    bus: Bus, nats_url: str, sqlenv: SqlEnv, tmp_path: Path
) -> None:
    """sqlflow stops while its question waits on the model (drained for half a second, then
    handed back to INGRESS): its keepalives stop with it, and the asker that heard them for
    longer than its idle timeout now gets `StreamTimeout`, with no answer."""
    await provision_pool(bus.js, "sql")
    asked = question()
    ask = SqlAsk(tenant="acme", question=asked, no_cache=True)
    items: list[StageEvent | StageProgress | SqlAnswer] = []
    async with (
        model_calls(bus, asked) as calls,
        contextlib.aclosing(stream_answer(bus, ask, idle_timeout=IDLE)) as stream,
        contextlib.AsyncExitStack() as flow,
    ):  # fmt: skip
        await flow.enter_async_context(
            sqlflow_in_process(nats_url, sqlenv, tmp_path / "index", keepalive_interval=KEEPALIVE,
                               summary=False, drain_timeout=0.5)
        )  # fmt: skip
        try:
            async for item in stream:
                items.append(item)
                # the model call, never answered, goes on
                if (
                    isinstance(item, StageProgress)
                    and item.stage == "intent"
                    and item.seconds >= 2 * IDLE
                ):
                    break
            assert not calls.empty(), "the question's model call was made"
            await flow.aclose()  # sqlflow stops
            with pytest.raises(StreamTimeout):
                async for item in stream:  # what it sent while draining, then silence
                    items.append(item)
        finally:
            await forget(bus, "INGRESS", subjects.sql_in("acme"), ask.id)
    assert not any(isinstance(i, SqlAnswer) for i in items), items[-1:]
    assert any(isinstance(i, StageProgress) and i.seconds >= 2 * IDLE for i in items)
