"""A consumer process for tests that must kill or signal a real process mid-message.

    python -m tests.support.consumer_proc NATS_URL STREAM DURABLE LOG SECONDS [ACK_WAIT]

For each message it appends `start <data>` to LOG, sleeps SECONDS, appends
`done <data>`, then returns (the loop acks). SIGTERM stops the loop gracefully.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from nats.aio.msg import Msg

from switchyard.bus.connection import connect
from switchyard.bus.consumer import PullLoop, RetryPolicy
from switchyard.config import Settings


async def main(
    url: str, stream: str, durable: str, log: Path, seconds: float, ack_wait: float
) -> None:
    bus = await connect(Settings(nats_url=url), "test-consumer")

    async def handle(msg: Msg) -> None:
        with log.open("a") as f:
            f.write(f"start {msg.data.decode()}\n")
        await asyncio.sleep(seconds)
        with log.open("a") as f:
            f.write(f"done {msg.data.decode()}\n")

    loop = PullLoop(
        bus.js,
        stream,
        durable,
        handle,
        retry=RetryPolicy(max_deliver=10),
        ack_wait=ack_wait,
        max_inflight=1,
    )
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, loop.stop)
    with log.open("a") as f:
        f.write("ready\n")
    await loop.run()
    with log.open("a") as f:
        f.write("stopped\n")
    await bus.close()


if __name__ == "__main__":
    url, stream, durable, log, seconds = sys.argv[1:6]
    ack_wait = float(sys.argv[6]) if len(sys.argv) > 6 else 30.0
    asyncio.run(main(url, stream, durable, Path(log), float(seconds), ack_wait))
