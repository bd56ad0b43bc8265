"""Every process a launcher started, followed while it runs, to check that none outlives it.

Children that lead their own sessions (the fleet's services, its `nats-server`) are not in
the launcher's process group, and once the launcher is gone they are re-parented to init:
so they are recorded while the launcher still runs (by parentage, recursively), and later
looked up by pid and start time (a pid reused by an unrelated process is not theirs).
"""

from __future__ import annotations

import contextlib
import subprocess
import time

import psutil


class Descendants:
    def __init__(self, launcher: subprocess.Popen[str]) -> None:
        self.launcher = launcher
        self.seen: dict[int, tuple[float, str]] = {}  # pid -> (start time, command line)

    def scan(self) -> int:
        """Record the launcher's descendants now; how many have been seen in all."""
        try:
            found = psutil.Process(self.launcher.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return len(self.seen)
        for child in found:
            with contextlib.suppress(psutil.NoSuchProcess):
                self.seen.setdefault(child.pid, (child.create_time(), " ".join(child.cmdline())))
        return len(self.seen)

    def alive(self) -> list[str]:
        """The recorded descendants still running (zombies are dead), as 'pid command'."""
        out = []
        for pid, (started, cmd) in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == started and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{pid} {cmd[:120]}")
            except psutil.NoSuchProcess:
                pass
        return out

    def wait_gone(self, timeout: float) -> float:
        """Seconds until the launcher and every descendant are gone; fails past `timeout`
        (killing what is left, so a failed test leaves no orphans either)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.launcher.poll() is None:
                self.scan()  # one started during the stop is still the launcher's
            elif not self.alive():
                return time.monotonic() - started
            time.sleep(0.1)
        left = self.alive()
        self.kill_all()
        raise AssertionError(
            f"{timeout} s after the signal: launcher exit {self.launcher.poll()}, still alive: "
            f"{left}"
        )

    def kill_all(self) -> None:
        if self.launcher.poll() is None:
            self.launcher.kill()
            self.launcher.wait()
        for pid, (started, _) in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == started:
                    proc.kill()
            except psutil.NoSuchProcess:
                pass
