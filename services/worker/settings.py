"""Worker settings: env `SY_WORKER_ID`, `SY_POOL`, `SY_ENGINE`, ... plus the shared `SY_*`."""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field

from switchyard.config import Settings
from switchyard.messages.fleet import WorkerRole
from switchyard.scheduling.links import LOCATION_PATTERN


def _default_host() -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())[:40]


def _visible_gpus() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return ["0"] if visible is None else [g.strip() for g in visible.split(",") if g.strip()]


def _default_id() -> str:
    return f"{_default_host()}-{os.getpid()}"


class WorkerSettings(Settings):
    worker_id: str = Field(default_factory=_default_id, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    pool: str = Field(default="llm", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    engine: Literal["vllm", "llamacpp", "sim"] = "llamacpp"
    # What it runs of a request (#39): `both`, or one stage of a disaggregated pool.
    worker_role: WorkerRole = "both"
    # Where its GPU sits, `host/socket/switch` as `nvidia-smi topo -m` shows it (#39,
    # scheduling/links.py); the default, the host name, tells machines apart only.
    worker_topology: str = Field(default_factory=_default_host, pattern=LOCATION_PATTERN)
    # The GPUs whose NVML telemetry it exports (`gpu.py`): indices or UUIDs; by default
    # CUDA_VISIBLE_DEVICES, or "0" (a container given one GPU sees it as 0).
    gpus: list[str] = Field(default_factory=_visible_gpus)
    # One-sequence engines (llama.cpp) run this many instances side by side.
    engine_instances: int = Field(default=1, ge=1, le=64)
    # "kv": follow the router's assignments in KV `fleet_assignments`;
    # "static": own `partitions_owned` (all partitions when empty), for a fleet without a router.
    assignment: Literal["kv", "static"] = "kv"
    partitions_owned: list[int] = []
    # Messages pulled per partition before the first is acked (late binding keeps it small).
    credit: int = Field(default=4, ge=1, le=256)
    heartbeat_interval: float = Field(default=2.0, gt=0)
    drain_timeout: float = Field(default=30.0, gt=0)
    # Longest wait for a moved partition's previous owner to stop pulling it.
    handoff_timeout: float = Field(default=10.0, gt=0)
    # Attempts before a failing request is dead-lettered (the consumer's max_deliver - 1).
    max_attempts: int = Field(default=5, ge=1)
    # The WORK consumers' ack wait (the topology's, same variable): in_progress() every third.
    work_ack_wait: float = Field(default=5.0, gt=0)
    # /healthz fails once the engine has held requests this long without a token or an
    # end (services/worker/probes.py): longer than any step or prefill (a long prompt on
    # llama.cpp's CPU is tens of seconds), so only a stuck engine trips it.
    liveness_stall: float = Field(default=120.0, gt=0)
