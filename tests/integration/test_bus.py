"""The bus on a real JetStream server: acks, redelivery, dedupe, dead letters,
in_progress and drain."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nats.aio.msg import Msg
from prometheus_client import REGISTRY

from switchyard.backoff import Backoff
from switchyard.bus.connection import Bus
from switchyard.bus.consumer import PullLoop, RetryPolicy
from switchyard.bus.provision import ensure_stream
from switchyard.bus.publish import MSG_ID, publish
from switchyard.bus.topology import TopologySettings, build_topology
from switchyard.codec import decode
from switchyard.errors import TransientError
from switchyard.messages.deadletter import DeadLetter
from switchyard.messages.inference import Cancel
from tests.conftest import REPO
from tests.support.poll import until
from tests.support.streams import scratch_stream


async def _ensure_dlq(bus: Bus) -> None:
    dlq = next(s for s in build_topology(TopologySettings()).streams if s.name == "DLQ")
    await ensure_stream(bus.js, dlq)


async def _run_until(loop: PullLoop, predicate: object, timeout: float = 10.0) -> None:
    task = asyncio.create_task(loop.run())
    deadline = time.monotonic() + timeout
    try:
        while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
            await asyncio.sleep(0.02)
    finally:
        loop.stop()
        await task


async def settled(bus: Bus, stream: str, durable: str) -> bool:
    """Whether `durable` has every message of `stream` delivered and acked."""
    info = await bus.js.consumer_info(stream, durable)
    return info.num_ack_pending == 0 and info.num_pending == 0


async def empty(bus: Bus, stream: str) -> bool:
    """Whether work-queue `stream` holds nothing: every message was acked."""
    return (await bus.js.stream_info(stream)).state.messages == 0


async def test_publish_pull_ack(bus: Bus, unique: str) -> None:
    stream, subject, durable = await scratch_stream(bus.js, unique)
    sent = [Cancel(tenant="t1", request_id=f"R{i}") for i in range(20)]
    for m in sent:
        ack = await publish(bus.js, subject, m)
        assert ack.stream == stream
    seen: list[Cancel] = []

    async def handle(msg: Msg) -> None:
        assert msg.headers and msg.headers[MSG_ID]
        seen.append(decode(msg.data, Cancel))

    loop = PullLoop(
        bus.js, stream, durable, handle, retry=RetryPolicy(4), ack_wait=5, max_inflight=4
    )
    await _run_until(loop, lambda: len(seen) == 20)
    assert sorted(m.id for m in seen) == sorted(m.id for m in sent)
    await until(lambda: settled(bus, stream, durable), timeout=10, what="every ack applied")
    info = await bus.js.consumer_info(stream, durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0
    assert (await bus.js.stream_info(stream)).state.messages == 0  # work queue: acked = gone


async def test_a_stopped_consumer_strands_nothing_on_its_pull(bus: Bus, unique: str) -> None:
    """A puller keeps a long pull outstanding (`PULL_EXPIRES`); once it stops, the server
    forgets that pull with the interest in its reply subject, so a message published
    afterwards waits for the next consumer instead of going to a closed inbox and sitting
    out its ack wait (30 s here)."""
    stream, subject, durable = await scratch_stream(bus.js, unique)
    seen: list[Msg] = []

    async def handle(msg: Msg) -> None:
        seen.append(msg)

    first = PullLoop(bus.js, stream, durable, handle, retry=RetryPolicy(4), ack_wait=30)
    running = asyncio.create_task(first.run())
    await until(lambda: _waiting(bus, stream, durable), timeout=5, what="the first loop's pull")
    first.stop()
    await running
    await publish(bus.js, subject, Cancel(tenant="t1", request_id="R-after"))
    info = await bus.js.consumer_info(stream, durable)
    assert (info.num_ack_pending, info.num_pending, info.num_waiting) == (0, 1, 0)
    second = PullLoop(bus.js, stream, durable, handle, retry=RetryPolicy(4), ack_wait=30)
    await _run_until(second, lambda: second.processed == 1, timeout=10)  # not the ack wait
    assert len(seen) == 1 and second.processed == 1


async def _waiting(bus: Bus, stream: str, durable: str) -> bool:
    return (await bus.js.consumer_info(stream, durable)).num_waiting == 1


async def test_msg_id_dedupe_within_window(bus: Bus, unique: str) -> None:
    stream, subject, _ = await scratch_stream(bus.js, unique)
    m = Cancel(tenant="t1", request_id="R1")
    first = await publish(bus.js, subject, m)
    again = await publish(bus.js, subject, m)
    assert not first.duplicate and again.duplicate and again.seq == first.seq
    await publish(bus.js, subject, Cancel(tenant="t1", request_id="R2"))
    assert (await bus.js.stream_info(stream)).state.messages == 2


async def test_transient_error_naks_and_retries(bus: Bus, unique: str) -> None:
    stream, subject, durable = await scratch_stream(bus.js, unique)
    await publish(bus.js, subject, Cancel(tenant="t1", request_id="R1"))
    attempts: list[float] = []

    async def flaky(msg: Msg) -> None:
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise TransientError("database restarting")

    loop = PullLoop(
        bus.js, stream, durable, flaky,
        retry=RetryPolicy(4, Backoff(first=0.2, cap=30.0)), ack_wait=5,
    )  # fmt: skip
    await _run_until(loop, lambda: loop.processed == 1)
    assert len(attempts) == 3
    # Equal jitter: the n-th wait lies in [ceiling/2, ceiling], the ceiling doubling.
    assert attempts[1] - attempts[0] >= 0.1  # backed off, not hot-looped
    assert attempts[2] - attempts[1] >= 0.2  # exponential: above the first wait's ceiling


async def test_dead_letter_after_max_deliver_with_reason(bus: Bus, unique: str) -> None:
    await _ensure_dlq(bus)
    stream, subject, durable = await scratch_stream(bus.js, unique, max_deliver=3)
    await publish(bus.js, subject, Cancel(tenant="t1", request_id="R1"))
    dlq_sub = await bus.js.subscribe(f"dlq.t.{unique}.>", ordered_consumer=True)

    async def always_fails(msg: Msg) -> None:
        raise ValueError("model said no")

    loop = PullLoop(
        bus.js, stream, durable, always_fails,
        retry=RetryPolicy(3, Backoff(first=0.05, cap=30.0)), ack_wait=5,
    )  # fmt: skip
    task = asyncio.create_task(loop.run())
    letter_msg = await dlq_sub.next_msg(timeout=10)
    loop.stop()
    await task
    letter = decode(letter_msg.data, DeadLetter)
    assert letter.subject == subject and letter.stream == stream
    assert "model said no" in letter.reason and letter.deliveries == 2
    assert decode(letter.payload, Cancel).request_id == "R1"  # the original bytes are kept
    assert (await bus.js.stream_info(stream)).state.messages == 0


async def test_undecodable_payload_is_dead_lettered_at_once(bus: Bus, unique: str) -> None:
    await _ensure_dlq(bus)
    stream, subject, durable = await scratch_stream(bus.js, unique)
    await bus.js.publish(subject, b"\xc1 not msgpack")
    dlq_sub = await bus.js.subscribe(f"dlq.t.{unique}.>", ordered_consumer=True)
    calls = 0

    async def handle(msg: Msg) -> None:
        nonlocal calls
        calls += 1
        decode(msg.data, Cancel)

    loop = PullLoop(bus.js, stream, durable, handle, retry=RetryPolicy(4), ack_wait=5)
    task = asyncio.create_task(loop.run())
    letter = decode((await dlq_sub.next_msg(timeout=10)).data, DeadLetter)
    loop.stop()
    await task
    assert calls == 1 and letter.code == "malformed" and letter.deliveries == 1
    counted = REGISTRY.get_sample_value(
        "sy_bus_dead_letters_total", {"stream": stream, "code": "malformed"}
    )
    assert counted == 1  # the stream is this test's own, so the count starts at 0


async def test_in_progress_keeps_a_long_job_from_redelivery(bus: Bus, unique: str) -> None:
    stream, subject, durable = await scratch_stream(bus.js, unique, ack_wait=1.0)
    await publish(bus.js, subject, Cancel(tenant="t1", request_id="R1"))
    deliveries: list[int] = []

    async def slow(msg: Msg) -> None:
        deliveries.append(msg.metadata.num_delivered)
        await asyncio.sleep(3.5)  # 3.5 x ack_wait

    loop = PullLoop(
        bus.js, stream, durable, slow, retry=RetryPolicy(4), ack_wait=1.0, max_inflight=2
    )
    await _run_until(loop, lambda: loop.processed == 1, timeout=15)
    await asyncio.sleep(1.5)  # 1.5 x ack_wait: a redelivery, if any, would have come by now
    assert deliveries == [1]
    assert (await bus.js.stream_info(stream)).state.messages == 0


def _spawn(
    nats_url: str, stream: str, durable: str, log: Path, seconds: float, ack_wait: float
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.consumer_proc", nats_url, stream, durable,
         str(log), str(seconds), str(ack_wait)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


async def _wait_for_line(log: Path, line: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and line in log.read_text().splitlines():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(
        f"{line!r} never appeared in {log}: {log.read_text() if log.exists() else ''}"
    )


async def test_redelivery_after_consumer_process_is_killed(
    bus: Bus, unique: str, nats_url: str, tmp_path: Path
) -> None:
    stream, subject, durable = await scratch_stream(bus.js, unique, ack_wait=1.0)
    await bus.js.publish(subject, b"job-1", headers={MSG_ID: "job-1"})
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = _spawn(nats_url, stream, durable, first_log, 30, 1.0)
    try:
        await _wait_for_line(first_log, "start job-1")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        first.kill()
    second = _spawn(nats_url, stream, durable, second_log, 0.1, 1.0)
    try:
        await _wait_for_line(second_log, "done job-1")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(20)
    assert "done job-1" not in first_log.read_text()
    await until(lambda: empty(bus, stream), timeout=10, what="job-1 acked")
    assert (await bus.js.stream_info(stream)).state.messages == 0  # processed again, then acked


async def test_sigterm_drains_in_flight_work(
    bus: Bus, unique: str, nats_url: str, tmp_path: Path
) -> None:
    stream, subject, durable = await scratch_stream(bus.js, unique, ack_wait=5.0)
    log = tmp_path / "drain.log"
    proc = _spawn(nats_url, stream, durable, log, 1.5, 5.0)
    try:
        await _wait_for_line(log, "ready")
        await bus.js.publish(subject, b"job-1")
        await _wait_for_line(log, "start job-1")
        proc.send_signal(signal.SIGTERM)
        await bus.js.publish(subject, b"job-2")  # arrives after SIGTERM: must stay queued
        assert await asyncio.to_thread(proc.wait, 20) == 0
    finally:
        proc.kill()
    lines = log.read_text().splitlines()
    assert lines[-2:] == ["done job-1", "stopped"]
    assert "start job-2" not in lines
    info = await bus.js.consumer_info(stream, durable)
    assert info.num_ack_pending == 0 and info.num_pending == 1  # job-1 acked, job-2 waits
