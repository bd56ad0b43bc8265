"""What a launcher started, it stops: the child processes of this process, and the signals
that stop them.

Every child a launcher starts (`nats-server`, the fleet's services) is `track`ed until it
is reaped. A launcher's command calls `stop_on_signals()` first: SIGTERM and SIGHUP then
stop it as Ctrl-C (SIGINT) does, by raising `KeyboardInterrupt`, so its `with` blocks
unwind and stop what they started in order (services drain, NATS last). A second signal
of any of the three, while that is under way, SIGKILLs every tracked child (and what it
spawned, for a child leading its own process group) and exits at once with 128 + the
signal: whoever presses Ctrl-C twice does not wait for a drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NoReturn

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_lock = threading.Lock()
# pid -> whether the child leads its own process group (then the whole group is killed).
_tracked: dict[int, bool] = {}
_signals = 0  # stopping signals received so far


def track(proc: subprocess.Popen[Any], *, own_group: bool) -> None:
    """`proc` runs until it is `untrack`ed: a second Ctrl-C kills it."""
    with _lock:
        _tracked[proc.pid] = own_group


def untrack(proc: subprocess.Popen[Any]) -> None:
    with _lock:
        _tracked.pop(proc.pid, None)


def kill_all() -> None:
    """SIGKILL every tracked child now (its process group, where it leads one)."""
    with _lock:
        children = list(_tracked.items())
    for pid, own_group in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if own_group:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)


def kill_now(signum: int) -> NoReturn:
    """The second stopping signal: every child killed, this process gone at once."""
    kill_all()
    name = signal.Signals(signum).name
    print(f"\n{name} again: killed what was still running", file=sys.stderr, flush=True)
    os._exit(128 + signum)


def _count(signum: int) -> None:
    """One more stopping signal: past the first, `kill_now`."""
    global _signals
    _signals += 1
    if _signals > 1:
        kill_now(signum)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _count(signum)
    raise KeyboardInterrupt


def stop_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP raise `KeyboardInterrupt` the first time and kill every
    child at once after that (see the module docstring). From the main thread only.

    Why SIGINT too, not only the other two: asyncio's own SIGINT handling (installed by
    `asyncio.run` only while the default handler is in place) would cancel the main task
    on the first Ctrl-C but raise in the middle of the unwinding on the second, leaving
    the children to their SIGTERM. Raised here, the first `KeyboardInterrupt` unwinds an
    event loop the same way (`asyncio.run` cancels and awaits every task on its way out).
    """
    for sig in STOPPING_SIGNALS:
        signal.signal(sig, _on_signal)


@contextlib.contextmanager
def stopping_on(loop: asyncio.AbstractEventLoop, first: Callable[[], None]) -> Iterator[None]:
    """While the block runs, the first stopping signal calls `first` on `loop` (a service
    or a supervisor sets its stop event and drains) and a second one is `kill_now`. The
    handlers of before are back afterwards (asyncio would leave the defaults, under
    which a signal in the rest of the unwinding would end the process where it stood)."""
    previous = {sig: signal.getsignal(sig) for sig in STOPPING_SIGNALS}

    def on_signal(signum: int) -> None:
        _count(signum)
        first()

    for sig in STOPPING_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield
    finally:
        for sig in STOPPING_SIGNALS:
            loop.remove_signal_handler(sig)
            before = previous[sig]
            signal.signal(sig, signal.SIG_DFL if before is None else before)
