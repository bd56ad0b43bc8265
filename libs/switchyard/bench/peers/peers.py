"""The peers: how to launch vLLM's router and SGLang's gateway (`smg`), and their versions.

Both ship on PyPI as a Python launcher around a Rust binary (the `bench` extra installs
them). Flags, from their `--help` of the pinned versions:

- `vllm-router --worker-urls URL... --policy {round_robin,cache_aware,consistent_hash,...}`;
  `consistent_hash` keys on the `X-Session-ID` header first (then `X-User-ID`, ..., then
  the body's `session_params`/`user`), which our clients send.
- `smg launch --worker-urls URL... --policy cache_aware` (SGLang's cache-aware radix-tree
  policy, the gateway's default).

Both check worker health at start-up (`--worker-startup-check-interval`, 30 s by default:
set to 1 so a run does not idle) and export Prometheus metrics on their own port, which we
move off the default 29000 so two never collide.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from switchyard.fleet import FleetError, ProcessGroup
from switchyard.fleet.processes import Child
from switchyard.ports import free_port

VLLM_ROUTER = "vllm-router"
SMG = "smg"


@dataclass(frozen=True)
class PeerCommand:
    name: str  # column label
    argv: list[str]
    url: str  # where it takes requests
    health_path: str = "/health"  # answers 200 once the peer routes
    # Their Rust logging would otherwise log every request at INFO whatever their
    # --log-level, which costs them time in a benchmark.
    env: dict[str, str] = field(default_factory=lambda: {"RUST_LOG": "warn"})


def binary(name: str) -> str:
    """The peer's launcher beside this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise FleetError(
            f"`{name}` is not installed: install the bench extra "
            f"(`.venv/bin/pip install -e '.[bench]'` or `make bench-peers`)"
        )
    return found


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def versions() -> dict[str, str]:
    return {"vllm-router": version("vllm-router"), "smg": version("smg")}


def command(peer: str, workers: Sequence[str], policy: str) -> PeerCommand:
    """`vllm-router` (`VLLM_ROUTER`), else `smg launch`, over `workers` by `policy`, on a free
    port and with its metrics on another."""
    port = free_port()
    launcher = [binary(VLLM_ROUTER)] if peer == VLLM_ROUTER else [binary(SMG), "launch"]
    return PeerCommand(
        name=f"{peer} {policy}", url=f"http://127.0.0.1:{port}",
        argv=[
            *launcher, "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *workers, "--policy", policy,
            "--prometheus-port", str(free_port()),
            "--log-level", "warning" if peer == VLLM_ROUTER else "warn",
            "--worker-startup-check-interval", "1", "--worker-startup-timeout-secs", "60",
        ],
    )  # fmt: skip


async def start(group: ProcessGroup, cmd: PeerCommand) -> Child:
    """Start the peer in `group`; its process, once it answers on its health path."""
    child = group.start(cmd.name.replace(" ", "-"), cmd.argv, cmd.env)
    await asyncio.to_thread(group.wait_http, child, cmd.url + cmd.health_path, 90)
    return child
