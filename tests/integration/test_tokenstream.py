"""Token streams over core NATS: complete, ordered, and never a silent hang."""

from __future__ import annotations

import asyncio

import pytest

from switchyard.bus.connection import Bus
from switchyard.bus.tokenstream import TokenStreamReader, TokenStreamWriter
from switchyard.errors import StreamTimeout
from switchyard.messages.inference import ErrorInfo, GenerateResult


async def test_ten_thousand_frames_arrive_complete_and_in_order(bus: Bus) -> None:
    async with TokenStreamReader(bus.nc, idle_timeout=10) as reader:
        writer = TokenStreamWriter(bus.nc, reader.inbox)

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
