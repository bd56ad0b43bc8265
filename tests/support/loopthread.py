"""An async context entered on an event loop of its own, in a thread.

For synchronous tests (schemathesis, benchmarks that call `asyncio.run` themselves) whose
callers run no event loop of their own while they wait on a fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def in_thread(
    make: Callable[[], contextlib.AbstractAsyncContextManager[Any]], name: str,
    start_timeout: float = 90.0,
) -> Iterator[None]:  # fmt: skip
    """Enter `make()` in a thread's own loop; leave it (on that loop) when the block ends.
    A failure while entering is raised here."""
    started, failed = threading.Event(), list[BaseException]()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def main() -> None:
        async with make():
            started.set()
            await stop.wait()

    def run() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as exc:
            failed.append(exc)
        finally:
            started.set()
            loop.close()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    started.wait(start_timeout)
    if failed:
        raise failed[0]
    try:
        yield
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(60)
