"""A patient publish against real nats-servers that send the JetStream errors it decides on
(`switchyard.bus.publish.JS_ERRORS`), each provoked for real:

- 10158 "duplicate message id is in process": a 3-node cluster whose stream followers are
  stopped (SIGSTOP), so the leader's proposal of the first try cannot commit and a
  retry with the same `Nats-Msg-Id` meets it in process (issue #36's CI failure).
- 10167 "too many requests": a server whose streams buffer one message
  (`max_buffered_msgs: 1`), under a burst.
- 10039 "JetStream not enabled for account": raised at once, not waited on.

The codes no server sends on demand are injected in `tests/unit/test_backoff.py`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js.api import StreamConfig

from switchyard.bus.connection import connect
from switchyard.bus.publish import MSG_ID, patiently, publish
from switchyard.codec import encode
from switchyard.config import Settings
from switchyard.messages.inference import Cancel
from switchyard.natsserver import EmbeddedCluster, EmbeddedNats


def _resume(servers: list[EmbeddedNats]) -> None:
    for server in servers:
        if server.proc is not None and server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(tmp_path_factory.mktemp("retry-cluster"), 3) as group:
        yield group


async def test_a_retry_of_a_publish_still_being_proposed_is_stored_once(
    cluster: EmbeddedCluster, unique: str
) -> None:
    stream, subject = f"R{unique}", f"r.{unique}"
    setup = await connect(Settings(nats_url=cluster.url), "test-retry-setup")
    try:
        await setup.js.add_stream(StreamConfig(name=stream, subjects=[subject], num_replicas=3))
        info = await setup.js.stream_info(stream)
        assert info.cluster is not None and info.cluster.leader
        leader = cluster.member(info.cluster.leader)
    finally:
        await setup.close()
    followers = [s for s in cluster.servers if s is not leader]
    # Only the leader: a client on a stopped server would hear nothing at all.
    bus = await connect(Settings(nats_url=leader.url), "test-retry")
    message = Cancel(tenant="t1", request_id=f"R-{unique}")
    headers = {MSG_ID: message.id}
    try:
        for server in followers:
            assert server.proc is not None
            os.kill(server.proc.pid, signal.SIGSTOP)
        # The first try is proposed; with no quorum its ack never comes.
        with pytest.raises(nats.errors.TimeoutError):
            await bus.js.publish(subject, encode(message), headers=dict(headers), timeout=1.0)
        # The same message again while that proposal is pending: the server says so.
        with pytest.raises(nats.js.errors.APIError) as raised:
            await bus.js.publish(subject, encode(message), headers=dict(headers), timeout=1.0)
        assert raised.value.err_code == 10158, raised.value
        # A patient publish of it waits, trying again, until the proposal commits.
        patient = asyncio.create_task(publish(bus.js, subject, message, patience=30.0))
        await asyncio.sleep(2.0)
        assert not patient.done(), "it must keep trying while the first try is in process"
        _resume(followers)
        ack = await asyncio.wait_for(patient, 30.0)
        assert ack.duplicate, "the first try was the one stored"
        assert ack.seq == 1
        state = (await bus.js.stream_info(stream)).state
        assert state.messages == 1
    finally:
        _resume(followers)
        await bus.close()


@pytest.fixture(scope="module")
def small_buffer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    data = tmp_path_factory.mktemp("small-buffer")
    with EmbeddedNats(data_dir=data, jetstream_config="    max_buffered_msgs: 1\n") as server:
        yield server


BURST = 400


async def test_a_full_ingest_queue_is_tried_again_and_loses_nothing(
    small_buffer: EmbeddedNats, unique: str
) -> None:
    bus = await connect(Settings(nats_url=small_buffer.url), "test-ingest")
    try:
        await bus.js.add_stream(StreamConfig(name=f"B{unique}", subjects=[f"b.{unique}.>"]))

        # A burst of plain publishes: the stream's queue of one overflows, and the server
        # refuses some with 429 / 10167 (each refused one is not stored).
        async def once(i: int) -> str:
            try:
                await bus.js.publish(f"b.{unique}.raw", b"x", headers={MSG_ID: f"raw-{i}"})
            except nats.js.errors.APIError as exc:
                return f"{exc.code}/{exc.err_code}"
            return "stored"

        outcomes = await asyncio.gather(*(once(i) for i in range(BURST)))
        refused = [o for o in outcomes if o != "stored"]
        assert refused, "the burst should overflow a queue of one message"
        assert set(refused) == {"429/10167"}, set(refused)

        # The same burst published patiently: every message is stored, once.
        messages = [Cancel(tenant="t1", request_id=f"P-{unique}-{i}") for i in range(BURST)]
        acks = await asyncio.gather(
            *(publish(bus.js, f"b.{unique}.patient", m, patience=30.0) for m in messages)
        )
        assert len({ack.seq for ack in acks}) == BURST
        info = await bus.js.stream_info(f"B{unique}", subjects_filter=f"b.{unique}.patient")
        assert (info.state.subjects or {}).get(f"b.{unique}.patient") == BURST
    finally:
        await bus.close()


ACCOUNTS = (
    "accounts {\n"
    "  JS: { jetstream: enabled, users: [{user: js, password: js}] }\n"
    "  PLAIN: { users: [{user: plain, password: plain}] }\n"
    "}\n"
)


async def test_jetstream_not_enabled_for_the_account_is_raised_at_once(tmp_path: Path) -> None:
    with EmbeddedNats(data_dir=tmp_path, extra_config=ACCOUNTS) as server:
        nc = await nats.connect(server.url, user="plain", password="plain")
        try:
            js = nc.jetstream(timeout=5)
            started = time.monotonic()
            with pytest.raises(nats.js.errors.APIError) as raised:
                await patiently(js.account_info, 30.0, what="account")
            elapsed = time.monotonic() - started
        finally:
            await nc.close()
    # A 503, but a configuration: not waited on for the patience.
    assert raised.value.code == 503 and raised.value.err_code == 10039, raised.value
    assert elapsed < 2.0, elapsed
