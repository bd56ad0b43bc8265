"""Token streams over core NATS: complete, ordered, and never a silent hang."""

from __future__ import annotations

import asyncio

import pytest

from switchyard.bus.connection import Bus
from switchyard.bus.tokenstream import Inbox, TokenStreamReader, TokenStreamWriter
from switchyard.errors import StreamTimeout
from switchyard.messages.inference import ErrorInfo, GenerateResult, TokenFrame
from tests.support.poll import until


async def test_ten_thousand_frames_arrive_complete_and_in_order(bus: Bus) -> None:
    async with TokenStreamReader(bus.nc, idle_timeout=10) as reader:
        writer = TokenStreamWriter(bus.nc, reader.inbox, coalesce=0)  # a frame per delta

        async def produce() -> None:
            for i in range(10_000):
                await writer.delta(f"{i},")
            await writer.end(
                GenerateResult(tenant="t", request_id="R", workload="llm", status="ok")
            )

        producer = asyncio.create_task(produce())
        frames = [f async for f in reader]
        await producer
    assert [f.seq for f in frames] == list(range(10_001))
    assert "".join(f.text for f in frames[:-1]) == "".join(f"{i}," for i in range(10_000))
    assert frames[-1].type == "end" and frames[-1].result and frames[-1].result.status == "ok"


async def test_a_burst_of_deltas_travels_as_few_frames_first_token_at_once(bus: Bus) -> None:
    """Coalescing: the first delta goes at once, the rest of a burst follows in one frame,
    text and token counts whole and in order; deltas further apart than the window are not
    held back."""
    async with TokenStreamReader(bus.nc, idle_timeout=10) as reader:
        writer = TokenStreamWriter(bus.nc, reader.inbox, coalesce=0.05)
        frames: list[TokenFrame] = []

        async def read() -> None:
            async for f in reader:
                frames.append(f)

        reading = asyncio.create_task(read())
        for i in range(500):
            await writer.delta(f"{i},", 1)
        await until(lambda: len(frames) >= 1, timeout=5, what="the first frame")
        # ... holding the first delta alone: it did not wait for the window
        assert frames[0].text == "0," and frames[0].tokens == 1
        await asyncio.sleep(0.2)  # the window closed: the held text went as one frame
        assert len(frames) == 2 and frames[1].tokens == 499
        await writer.delta("late", 2)  # after the window: at once
        await until(lambda: len(frames) == 3, timeout=5, what="the late delta")
        await writer.delta("x", 1)  # within the window of "late": held, then sent by end
        await writer.end(GenerateResult(tenant="t", request_id="R", workload="llm", status="ok"))
        await reading
    deltas = [f for f in frames if f.type == "delta"]
    assert "".join(f.text for f in deltas) == "".join(f"{i}," for i in range(500)) + "latex"
    assert sum(f.tokens for f in deltas) == 503
    assert [f.seq for f in frames] == list(range(len(frames))) and frames[-1].type == "end"


async def test_readers_share_one_subscription_and_see_only_their_own_frames(bus: Bus) -> None:
    before = len(bus.nc._subs)
    async with (
        TokenStreamReader(bus.nc, idle_timeout=5) as a,
        TokenStreamReader(bus.nc, idle_timeout=5) as b,
    ):
        assert a.inbox != b.inbox
        for reader, word in ((a, "alpha"), (b, "beta")):
            writer = TokenStreamWriter(bus.nc, reader.inbox)
            await writer.delta(word)
            await writer.end(
                GenerateResult(tenant="t", request_id=word, workload="llm", status="ok")
            )
        got = {r.inbox: [f async for f in r] for r in (a, b)}
    assert "".join(f.text for f in got[a.inbox]) == "alpha"
    assert "".join(f.text for f in got[b.inbox]) == "beta"
    assert len(bus.nc._subs) <= before + 1  # one wildcard subscription, not one per reader


async def test_error_frame_ends_the_stream(bus: Bus) -> None:
    async with TokenStreamReader(bus.nc, idle_timeout=5) as reader:
        writer = TokenStreamWriter(bus.nc, reader.inbox)
        await writer.delta("partial")
        await writer.error(ErrorInfo(code="engine_error", reason="grammar rejected"))
        frames = [f async for f in reader]
    assert [f.type for f in frames] == ["delta", "error"]
    assert frames[-1].error and frames[-1].error.reason == "grammar rejected"


async def test_lost_end_of_stream_times_out_with_a_clear_error(bus: Bus) -> None:
    async with TokenStreamReader(bus.nc, idle_timeout=0.5) as reader:
        writer = TokenStreamWriter(bus.nc, reader.inbox)
        await writer.delta("a")
        await writer.delta("b")  # ... and the worker dies before its end frame
        got: list[str] = []
        with pytest.raises(StreamTimeout, match="without an end-of-stream frame"):
            async for frame in reader:
                got.append(frame.text)
    assert got == ["a", "b"]


async def test_a_taken_over_stream_continues_without_repeating_text(bus: Bus) -> None:
    """Worker A dies after two deltas; worker B (attempt 2) streams the request again."""
    async with TokenStreamReader(bus.nc, idle_timeout=5) as reader:
        first = TokenStreamWriter(bus.nc, reader.inbox, attempt=1)
        await first.delta("ab")
        await first.delta("cd")
        second = TokenStreamWriter(bus.nc, reader.inbox, attempt=2)
        for piece in ("ab", "cd", "ef"):
            await second.delta(piece)
        await first.delta("late")  # a straggler from the dead attempt is ignored
        await second.end(GenerateResult(tenant="t", request_id="R", workload="llm", status="ok"))
        frames = [f async for f in reader]
    assert "".join(f.text for f in frames if f.type == "delta") == "abcdef"
    assert frames[-1].type == "end"


async def test_next_with_a_timeout_loses_nothing_and_idleness_still_ends_the_stream(
    bus: Bus,
) -> None:
    """What the edge relies on between frames (SSE heartbeats, disconnect checks): a `next`
    that times out returns None and the frames that come later arrive whole and in order;
    silence past `idle_timeout` is still a `StreamTimeout`."""
    async with TokenStreamReader(bus.nc, idle_timeout=0.6) as reader:
        writer = TokenStreamWriter(bus.nc, reader.inbox, coalesce=0)
        assert await reader.next(0.05) is None
        await writer.delta("a")
        await writer.delta("b")
        got = [await reader.next(2), await reader.next(2)]
        assert [f.text for f in got if f] == ["a", "b"]
        assert await reader.next(0.05) is None
        with pytest.raises(StreamTimeout):
            while True:
                await reader.next(0.1)


async def test_the_wait_for_the_first_message_may_be_longer_than_the_silence_after(
    bus: Bus,
) -> None:
    """`first_timeout`: a question queued behind others has nobody to speak for it, so
    the asker waits longer for its first frame than it lets the orchestrator go silent."""
    async with Inbox(bus.nc, idle_timeout=0.2, first_timeout=30) as inbox:
        # five idle timeouts without a message: still waiting (None), no StreamTimeout
        assert await inbox.message(timeout=1.0) is None
        await bus.nc.publish(inbox.inbox, b"taken")
        first = await inbox.message(timeout=10)
        assert first is not None and first.data == b"taken"
        with pytest.raises(StreamTimeout, match=r"silent for 0\.2s"):
            await inbox.message(timeout=10)  # now the idle timeout holds
