"""The JetStream topology (ARCHITECTURE.md, Subjects, streams and KV), declared once.

Provisioning (`switchyard.bus.provision`), `sy provision`, the AsyncAPI
document in `proto/` and the tests all read these declarations.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from switchyard import subjects
from switchyard.config import Settings

HOUR = 3600.0
DAY = 24 * HOUR

# The KV buckets, named once: every reader and writer imports these.
WORKERS_BUCKET = "fleet_workers"  # worker id -> WorkerHeartbeat (TTL)
ASSIGNMENTS_BUCKET = "fleet_assignments"  # <pool>.p<k> -> Assignment (CAS)
SESSIONS_BUCKET = "fleet_sessions"  # <pool>.<tenant>.<session> -> SessionRoute
TENANTS_BUCKET = "fleet_tenants"  # <tenant>.<router> -> TenantStatus (TTL)
IDEMPOTENCY_BUCKET = "idempotency"  # <tenant>.<key hash> -> Claim (TTL)
WINDOWS_BUCKET = "agent_windows"  # <pool>.<tenant>.<session>.<step> -> WindowFrame (TTL)
ROUTER_BUCKET = "fleet_router"  # pools.<pools> -> RouterLease (TTL = the lease's length)


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    retention: Literal["limits", "workqueue"]
    max_age: float  # seconds, 0 = forever
    storage: Literal["file", "memory"] = "file"
    duplicate_window: float = 120.0
    max_msg_size: int = 8 * 1024 * 1024
    description: str = ""
    # Copies on a JetStream cluster (1 on a single server; 3 survives losing any one node).
    replicas: int = 1
    # Server tags the copies must be placed on (e.g. a region), none = anywhere.
    placement_tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class ConsumerSpec:
    stream: str
    durable: str
    filter_subject: str
    ack_wait: float = 30.0
    # Deliveries the server makes; our loop dead-letters on the last one, so a
    # message whose handler crashed the process every time still gets a reason.
    max_deliver: int = 6
    max_ack_pending: int = 4


@dataclass(frozen=True)
class BucketSpec:
    name: str
    ttl: float  # seconds, 0 = no expiry
    history: int = 1
    description: str = ""
    replicas: int = 1
    placement_tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Topology:
    streams: tuple[StreamSpec, ...]
    consumers: tuple[ConsumerSpec, ...]
    buckets: tuple[BucketSpec, ...]
    extra: dict[str, str] = field(default_factory=dict)


class TopologySettings(Settings):
    """What an operator may tune about the topology (env `SY_...`)."""

    model_config = SettingsConfigDict(env_prefix="SY_")

    ingress_max_age: float = Field(default=DAY, ge=0)
    res_max_age: float = Field(default=DAY, ge=0)
    audit_max_age: float = Field(default=365 * DAY, ge=0)
    dlq_max_age: float = Field(default=7 * DAY, ge=0)
    heartbeat_ttl: float = Field(default=10.0, gt=0)
    idempotency_ttl: float = Field(default=DAY, gt=0)
    # How long a session keeps its worker after its last request (the router's
    # `session_ttl` must be the same: it expires its mirror of the bucket by it).
    session_ttl: float = Field(default=600.0, gt=0)
    # How long an agent session's window frames outlive its last step (KV `agent_windows`);
    # a session that pauses longer restarts its window (services/preprocessor/window.py).
    agent_window_ttl: float = Field(default=120.0, gt=0)
    pools: list[str] = ["agent", "sql", "llm"]
    # How long a dead worker's requests wait before the next owner of their partition gets
    # them: a live worker keeps each one it holds with `in_progress()` every third of this
    # (`bus.consumer.PullLoop`), so it can be short. With a 10 s heartbeat TTL and a router
    # declaring death after 6 s, a dead worker's requests run again within ~8 s (#24; at
    # 30 s they waited ~30 s).
    work_ack_wait: float = Field(default=5.0, gt=0)
    # How long a crashed router's queued requests wait before another router gets them
    # (the router keeps each one it holds alive every third of this).
    req_ack_wait: float = Field(default=10.0, gt=0)
    # How long the router lease lasts unrenewed (KV `fleet_router`): a standby router takes
    # over this long after the active one died (services/router/leadership.py). Longer than
    # a JetStream cluster takes to elect the bucket's new leader after losing a node (2-8 s
    # measured): with 5 s, the admitting router stepped down in every such election.
    router_lease: float = Field(default=10.0, ge=1.0)
    work_credit: int = Field(default=4, ge=1, le=256)
    max_attempts: int = Field(default=5, ge=1, le=100)
    storage: Literal["file", "memory"] = "file"
    # Copies of every stream and KV bucket on a JetStream cluster: 1 on one server (a
    # single server refuses more), 3 in production (deploy/k8s, compose's cluster
    # profile), so losing any one node loses nothing. `stream_replicas` overrides it per
    # stream or bucket by name (env JSON: SY_STREAM_REPLICAS='{"RES": 1}').
    replicas: int = Field(default=1, ge=1, le=5)
    stream_replicas: dict[str, int] = {}
    # Server tags (`server_tags` in nats.conf) every stream's copies must be placed on.
    placement_tags: list[str] = []

    @model_validator(mode="after")
    def _replicas_in_range(self) -> TopologySettings:
        wrong = {name: n for name, n in self.stream_replicas.items() if not 1 <= n <= 5}
        if wrong:
            raise ValueError(f"stream_replicas must be 1-5 copies: {wrong}")
        return self

    def replicas_of(self, name: str) -> int:
        return self.stream_replicas.get(name, self.replicas)


ROUTER_DURABLE = "router"


def build_topology(s: TopologySettings) -> Topology:
    mb = s.max_message_bytes
    streams = (
        StreamSpec(
            "INGRESS",
            ("agent.in.>", "sql.in.>", "llm.in.>", "llm.edge.>"),
            "limits",
            s.ingress_max_age,
            s.storage,
            max_msg_size=mb,
            description="Everything clients sent, kept for replay.",
        ),
        StreamSpec(
            "REQ",
            ("req.>",),
            "workqueue",
            0,
            s.storage,
            max_msg_size=mb,
            description="Prepared inference requests waiting for the router.",
        ),
        StreamSpec(
            "WORK",
            ("work.>",),
            "workqueue",
            0,
            s.storage,
            max_msg_size=mb,
            description="Dispatched work, one partition per durable consumer.",
        ),
        StreamSpec(
            "RES",
            (subjects.RES_ALL,),
            "limits",
            s.res_max_age,
            s.storage,
            max_msg_size=mb,
            description="Results of every request, for clients, replay and diffs.",
        ),
        StreamSpec(
            "AUDIT",
            ("audit.>",),
            "limits",
            s.audit_max_age,
            "file",
            max_msg_size=mb,
            description="Audit events on their way to the append-only table.",
        ),
        StreamSpec(
            "DLQ",
            ("dlq.>",),
            "limits",
            s.dlq_max_age,
            "file",
            max_msg_size=mb + 64 * 1024,
            description="Messages the fleet gave up on, with the reason.",
        ),
    )
    deliver = s.max_attempts + 1
    consumers: list[ConsumerSpec] = [
        ConsumerSpec("REQ", ROUTER_DURABLE, "req.>", s.req_ack_wait, deliver, 100_000),
        ConsumerSpec("AUDIT", "auditor", "audit.>", 30.0, deliver, 1000),
        # Ingress consumers: INGRESS keeps everything for replay, so these are not work queues.
        ConsumerSpec("INGRESS", "preprocessor-chat", "llm.in.>", 30.0, deliver, 256),
        ConsumerSpec("INGRESS", "preprocessor-agent", "agent.in.>", 30.0, deliver, 256),
        ConsumerSpec("INGRESS", "sqlflow", "sql.in.>", 30.0, deliver, 256),
    ]
    for pool in s.pools:
        for p in range(s.partitions):
            consumers.append(
                ConsumerSpec(
                    "WORK",
                    subjects.work_consumer(pool, p),
                    subjects.work(pool, p),
                    s.work_ack_wait,
                    deliver,
                    s.work_credit,
                )
            )
    buckets = (
        BucketSpec(WORKERS_BUCKET, s.heartbeat_ttl, 1, "Worker heartbeats (expire with TTL)."),
        BucketSpec(ASSIGNMENTS_BUCKET, 0, 1, "Partition -> worker, written with CAS."),
        BucketSpec(IDEMPOTENCY_BUCKET, s.idempotency_ttl, 1, "Idempotency-Key -> request id."),
        BucketSpec(SESSIONS_BUCKET, s.session_ttl, 1, "Session -> worker (TTL, create/CAS)."),
        # Outlives the router lease: a router taking over resumes tenants' usage from it.
        BucketSpec(TENANTS_BUCKET, s.heartbeat_ttl + s.router_lease, 1, "Tenants' usage."),
        BucketSpec(WINDOWS_BUCKET, s.agent_window_ttl, 1, "Agent sessions' window frames (TTL)."),
        BucketSpec(ROUTER_BUCKET, s.router_lease, 1, "The active router's lease (TTL)."),
    )
    tags = tuple(s.placement_tags)
    return Topology(
        tuple(replace(x, replicas=s.replicas_of(x.name), placement_tags=tags) for x in streams),
        tuple(consumers),
        tuple(replace(b, replicas=s.replicas_of(b.name), placement_tags=tags) for b in buckets),
    )
