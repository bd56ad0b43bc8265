"""Router settings (`SY_*`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from switchyard.config import Settings
from switchyard.scheduling.affinity import Policy


class RouterSettings(Settings):
    router_id: str = Field(default="router", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    tenant_policy: Path | None = Field(
        default=None, description="YAML tenant policies; unset = one permissive default policy"
    )
    pools: list[str] = ["agent", "sql", "llm"]
    # Outstanding requests per engine slot a worker may hold (late binding: keep small).
    credit_per_slot: int = Field(default=2, ge=1, le=64)
    # A worker whose last heartbeat is older than this is dead; its partitions move.
    dead_after: float = Field(default=6.0, gt=0)
    # Partitions per worker within (1 + epsilon) x its slot share.
    epsilon: float = Field(default=0.25, gt=0, description="bounded-load slack, partitions")
    # A worker is overloaded above (1 + load_epsilon) x the pool's mean load per slot (the
    # GPU time it owes, in output tokens: scheduling/affinity): new work avoids it and,
    # once that lasts `move_hold`, one session or conversation moves off.
    load_epsilon: float = Field(default=0.15, gt=0, description="bounded-load slack, load")
    routing_policy: Policy = Field(
        default="switchyard", description="how a request's worker is chosen (scheduling/affinity)"
    )
    prefix_weight: float = Field(
        default=0.1, ge=0, description="load (output tokens) an uncached prompt token costs"
    )
    load_window: float = Field(
        default=30.0, ge=0, description="seconds a worker's load is averaged over to judge overload"
    )
    move_hold: float = Field(
        default=2.0, ge=0, description="seconds a worker stays overloaded before a session moves"
    )
    move_cooldown: float = Field(
        default=30.0, ge=0, description="a session moves for load at most once per this"
    )
    # Must equal the topology's `session_ttl` (the KV bucket's TTL): same env variable.
    session_ttl: float = Field(default=600.0, gt=0, description="a session keeps its worker")
    rebalance_interval: float = Field(default=1.0, gt=0)
    max_queue_seconds: float = Field(default=60.0, gt=0, description="then answered 'timeout'")
    w_in: float = Field(default=1.0, gt=0)
    w_out: float = Field(default=2.0, gt=0)
    aging: float = Field(default=10.0, gt=0, description="seconds per priority class gained")
    locality_bound: float = Field(default=4096.0, ge=0, description="weighted tokens")
    warm_seconds: float = Field(default=30.0, gt=0, description="a session stays warm this long")
    # Must equal the topology's `req_ack_wait` (the REQ consumer's): same env variable.
    req_ack_wait: float = Field(default=10.0, gt=0)
    fetch_batch: int = Field(default=256, ge=1, le=10_000)
    # How long a dispatch waits for WORK to store it before the request is queued again
    # (a retried publish is stored once: WORK dedupes by request id).
    work_publish_timeout: float = Field(default=10.0, gt=0)
    top_tenants: int = Field(default=20, ge=1, description="tenants labelled in metrics")
