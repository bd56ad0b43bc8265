"""Child processes for a benchmark: started with a log file, checked ready, always stopped.

Every process starts in its own session, so stopping it also stops what it spawned
(`smg` and `vllm-router` are Python launchers around a Rust binary). `ProcessGroup` is a
context manager: on exit, for any reason, it sends SIGTERM to every process group it
started, waits, then SIGKILLs what is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType


class PeerStartError(RuntimeError):
    """A process of the benchmark could not start; the message names it and quotes its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def failure(self, why: str) -> PeerStartError:
        return PeerStartError(f"{self.name} {why}; last lines of {self.log}:\n{log_tail(self.log)}")


class ProcessGroup:
    """Starts processes, waits for them to be ready, and stops them all on exit."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[Child] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            try:
                proc = subprocess.Popen(  # noqa: S603 - argv built by this package, no shell
                    list(argv),
                    # RUST_LOG: the peers' Rust logging would otherwise log every request at
                    # INFO whatever their --log-level, which costs them time in a benchmark.
                    env={**os.environ, "RUST_LOG": "warn", **(env or {})},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as e:
                raise PeerStartError(f"{name} could not be started ({argv[0]}): {e}") from e
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def wait_http(self, child: Child, url: str, timeout: float = 60.0) -> None:
        """Until `url` answers 200; a clear error if the process dies or never answers."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if not child.alive():
                raise child.failure(f"exited with status {child.proc.returncode} at start")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - our localhost
                    if r.status == 200:
                        return
                    last = f"HTTP {r.status}"
            except (OSError, urllib.error.URLError) as e:
                last = str(e)
            time.sleep(0.2)
        raise child.failure(f"did not answer 200 on {url} within {timeout:.0f}s ({last})")

    def stop(self, child: Child, grace: float = 10.0) -> None:
        if child.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.proc.pid, signal.SIGTERM)
            try:
                child.proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait(5)
        else:  # the launcher is gone; make sure nothing it spawned outlived it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.proc.pid, signal.SIGKILL)
        if child in self.children:
            self.children.remove(child)

    def close(self) -> None:
        for child in list(reversed(self.children)):
            if child.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGTERM)
        for child in list(reversed(self.children)):
            self.stop(child)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.close()
