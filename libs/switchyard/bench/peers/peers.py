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

import importlib.metadata
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from switchyard.fleet import FleetError

VLLM_ROUTER = "vllm-router"
SMG = "smg"


@dataclass(frozen=True)
class PeerCommand:
    name: str  # column label
    argv: list[str]
    health_path: str  # answers 200 once the peer routes
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


def vllm_router(port: int, metrics_port: int, workers: Sequence[str], policy: str) -> PeerCommand:
    return PeerCommand(
        name=f"vllm-router {policy}",
        argv=[
            binary(VLLM_ROUTER), "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *workers, "--policy", policy,
            "--prometheus-port", str(metrics_port), "--log-level", "warning",
            "--worker-startup-check-interval", "1", "--worker-startup-timeout-secs", "60",
        ],
        health_path="/health",
    )  # fmt: skip


def smg(port: int, metrics_port: int, workers: Sequence[str], policy: str) -> PeerCommand:
    return PeerCommand(
        name=f"smg {policy}",
        argv=[
            binary(SMG), "launch", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *workers, "--policy", policy,
            "--prometheus-port", str(metrics_port), "--log-level", "warn",
            "--worker-startup-check-interval", "1", "--worker-startup-timeout-secs", "60",
        ],
        health_path="/health",
    )  # fmt: skip
