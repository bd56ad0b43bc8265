"""CPU time per process while a column runs: where a request's work is done.

On a shared 2-core box latency is mostly waiting for a core, so the CPU seconds each
process spends per request are the figure a regression shows in first, and the one that
says which process it is in. Every process the benchmark started is its child (the
peers, the sim servers, the fleet's services and its nats-server), named here by what
it runs; the benchmark's own process is the load generator.
"""

from __future__ import annotations

import contextlib

import psutil

LOAD_GENERATOR = "load generator"


def process_name(cmdline: list[str]) -> str:
    """`services.router` -> `router`; a peer or server by its program; else its argv[0]."""
    for arg in cmdline:
        if arg.startswith("services."):
            return arg.removeprefix("services.")
    joined = " ".join(cmdline).replace("_", "-").replace("::", "-")
    for known in ("nats-server", "sim-server", "vllm-router", "smg"):
        if known in joined:
            return known
    return cmdline[0].rsplit("/", 1)[-1] if cmdline else "?"


class CpuMeter:
    """CPU seconds (user + system) so far, per process name, over this process and every
    descendant (a child's own children count as it)."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        self._names: dict[int, str] = {}

    def snapshot(self) -> dict[str, float]:
        out = {LOAD_GENERATOR: _cpu(self.me)}
        for child in self.me.children(recursive=True):
            with contextlib.suppress(psutil.Error):  # it may have exited meanwhile
                name = self._name(child)
                out[name] = out.get(name, 0.0) + _cpu(child)
        return out

    def _name(self, proc: psutil.Process) -> str:
        name = self._names.get(proc.pid)
        if name is None:
            top = proc
            with contextlib.suppress(psutil.Error):
                while (parent := top.parent()) is not None and parent.pid != self.me.pid:
                    top = parent
            name = self._names[proc.pid] = process_name(top.cmdline())
        return name


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)
