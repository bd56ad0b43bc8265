"""Child processes of a launcher: started in their own sessions, logged, always stopped.

Every child leads its own session and process group. A terminal's Ctrl-C then reaches
only the launcher, which stops the children in order, and stopping a child also stops
what it spawned (`smg` and `vllm-router` are Python launchers around a Rust binary).

A child's output goes to a log file of its own, or line by line to a callback (`sy up`
prints it); either way its last lines are kept, so the error that reports a crash can
quote them. Leaving a `ProcessGroup`, for any reason, sends SIGTERM to every child
still running, waits up to `grace` seconds, then SIGKILLs the rest.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

from switchyard import children
from switchyard.fleet.errors import FleetError, NotReady, ServiceExited
from switchyard.fleet.readiness import wait_http

# (child name, one line of its output without the newline); called from a reader thread.
OutputSink = Callable[[str, str], None]

TAIL_LINES = 25
GRACE = 10.0  # s between SIGTERM and SIGKILL, unless the group is told otherwise


@dataclass(frozen=True)
class Stopped:
    """How a child ended when its group stopped it."""

    name: str
    returncode: int
    killed: bool  # still running `grace` seconds after SIGTERM, so SIGKILLed


class Child:
    """One started process: its name in the group, the `Popen`, and where its output went."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], log: Path | None) -> None:
        self.name = name
        self.proc = proc
        self.log = log
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        """Everything it wrote so far (the kept last lines when it writes to a callback)."""
        if self.log is None:
            return "\n".join(self._tail)
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = TAIL_LINES) -> str:
        return "\n".join(self.output().splitlines()[-lines:]) or "(no output)"

    def failure(self, why: str) -> ServiceExited:
        where = f"last lines of {self.log}" if self.log is not None else "its last lines"
        return ServiceExited(f"{self.name} {why}; {where}:\n{self.tail()}")

    def check(self) -> None:
        """Raise `ServiceExited`, with the end of its output, if it is no longer running."""
        if not self.alive():
            raise self.failure(f"exited with status {self.proc.returncode} at start")

    def _pump(self, stream: IO[bytes], sink: OutputSink) -> None:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\r\n")
            self._tail.append(line)
            sink(self.name, line)


class ProcessGroup:
    """Starts child processes and stops every one of them on exit.

    `log_dir`: one `<name>.log` per child (a fresh temporary directory when neither it
    nor `on_output` is given; it is kept, for a look after a failure). `on_output`:
    every line of every child, instead of the files. `env` is laid over this process's
    environment for every child, and each child's own `env` over that.
    """

    def __init__(
        self, log_dir: Path | None = None, *, on_output: OutputSink | None = None,
        env: Mapping[str, str] | None = None, grace: float = GRACE,
    ) -> None:  # fmt: skip
        if log_dir is None and on_output is None:
            log_dir = Path(tempfile.mkdtemp(prefix="sy-fleet-"))
        self.log_dir = log_dir
        self.on_output = on_output
        self.env = dict(env or {})
        self.grace = grace
        self.children: list[Child] = []
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        full_env = {**os.environ, **self.env, **(env or {})}
        log = None if self.on_output is not None else self._log_dir() / f"{name}.log"
        with contextlib.ExitStack() as files:
            out: int | IO[bytes] = subprocess.PIPE
            if log is not None:
                out = files.enter_context(log.open("wb"))
            try:
                proc = subprocess.Popen(  # noqa: S603 - argv built by our callers, no shell
                    list(argv), env=full_env, stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
            except OSError as exc:
                raise FleetError(f"{name} could not be started ({argv[0]}): {exc}") from exc
        children.track(proc, own_group=True)
        child = Child(name, proc, log)
        if self.on_output is not None and proc.stdout is not None:
            child._reader = threading.Thread(
                target=child._pump, args=(proc.stdout, self.on_output), name=f"out-{name}",
                daemon=True,
            )  # fmt: skip
            child._reader.start()
        self.children.append(child)
        return child

    def check(self) -> None:
        """Raise `ServiceExited` for the first child that is no longer running."""
        for child in self.children:
            child.check()

    def exited(self) -> list[Child]:
        return [child for child in self.children if not child.alive()]

    def wait_http(self, child: Child, url: str, timeout: float = 60.0) -> None:
        """Until `url` answers 200; fails at once, with its log, if `child` exits first."""
        try:
            wait_http(url, timeout=timeout, check=child.check)
        except NotReady as exc:
            raise child.failure(str(exc)) from None

    def stop(self, child: Child, grace: float | None = None) -> Stopped:
        """SIGTERM `child`, SIGKILL it after `grace`; it leaves the group."""
        if child.alive():
            _signal(child, signal.SIGTERM)
        (stopped,) = self._reap([child], grace)
        self.children.remove(child)
        return stopped

    def close(self, grace: float | None = None) -> list[Stopped]:
        """SIGTERM every child at once, SIGKILL those still running `grace` s later."""
        running = list(self.children)
        for child in reversed(running):
            if child.alive():
                _signal(child, signal.SIGTERM)
        stopped = self._reap(running, grace)
        self.children.clear()
        return stopped

    def _reap(self, group: list[Child], grace: float | None) -> list[Stopped]:
        deadline = time.monotonic() + (self.grace if grace is None else grace)
        stopped = []
        for child in group:
            killed = False
            try:
                child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed = True
                _signal(child, signal.SIGKILL)
                child.proc.wait()
            else:  # it is gone; make sure nothing it spawned outlived it
                _signal(child, signal.SIGKILL)
            children.untrack(child.proc)
            if child._reader is not None:
                child._reader.join(2.0)  # its last lines are out before we report it stopped
            stopped.append(Stopped(child.name, child.proc.returncode, killed))
        return stopped

    def _log_dir(self) -> Path:
        if self.log_dir is None:
            raise FleetError("this group sends output to a callback: it has no log directory")
        return self.log_dir

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.close()


def _signal(child: Child, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.proc.pid, sig)  # the child leads its own process group
