"""Start pieces of a fleet for a benchmark: an embedded NATS and worker processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from nats.js import JetStreamContext

from switchyard.codec import decode
from switchyard.messages.fleet import WorkerHeartbeat
from switchyard.natsserver import EmbeddedNats, reachable


@contextlib.contextmanager
def nats_for_bench(url: str | None) -> Iterator[str]:
    """`url` if given and reachable, else a throwaway embedded server."""
    if url:
        host, _, port = url.removeprefix("nats://").partition(":")
        if not reachable(host, int(port or 4222)):
            raise RuntimeError(f"NATS at {url} is not reachable")
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="sy-bench-") as tmp, EmbeddedNats(Path(tmp)) as server:
        yield server.url


async def wait_for_workers(js: JetStreamContext, ids: set[str], timeout: float = 60) -> None:
    """Until every worker in `ids` heartbeats with at least one bound partition."""
    kv = await js.key_value("fleet_workers")
    deadline = time.monotonic() + timeout
    ready: set[str] = set()
    while time.monotonic() < deadline:
        for worker in ids - ready:
            with contextlib.suppress(Exception):
                entry = await kv.get(worker)
                if entry.value and decode(entry.value, WorkerHeartbeat).partitions:
                    ready.add(worker)
        if ready == ids:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"workers {sorted(ids - ready)} did not come up within {timeout}s")


@contextlib.contextmanager
def service_processes(
    name: str, nats_url: str, envs: list[dict[str, str]]
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """One `python -m services.<name>` per entry of `envs` (`SY_*` overrides)."""
    procs: list[subprocess.Popen[bytes]] = []
    log_dir = Path(tempfile.mkdtemp(prefix=f"sy-bench-{name}-"))
    try:
        for i, env in enumerate(envs):
            full = {**os.environ, "SY_NATS_URL": nats_url, **env}
            log = (log_dir / f"{name}-{i}.log").open("wb")
            procs.append(
                subprocess.Popen(  # noqa: S603 - our own interpreter and module name
                    [sys.executable, "-m", f"services.{name}"],
                    env=full,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        time.sleep(0.2)
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"a {name} process exited at start; see {log_dir}")
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
