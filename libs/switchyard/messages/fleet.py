"""Fleet state kept in KV buckets: worker heartbeats, partition assignments, session routes,
tenants' usage."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from switchyard.envelope import Model, SessionId, ShortText, TenantId, Token, UnixTime
from switchyard.scheduling.links import LOCATION_PATTERN

WorkerRole = Literal["both", "prefill", "decode"]


class WorkerHeartbeat(Model):
    """A worker's value in KV `fleet_workers` (key = worker id); expires with the bucket TTL."""

    v: int = 1
    worker: Token
    pool: Token
    engine: ShortText
    at: UnixTime
    partitions: Annotated[list[int], Field(max_length=4096)] = []
    slots: int = Field(ge=1)
    running: int = Field(default=0, ge=0)
    waiting: int = Field(default=0, ge=0)
    queued: int = Field(default=0, ge=0)
    kv_cache_usage: float = Field(default=0.0, ge=0.0, le=1.0)
    # Its engine's KV cache in tokens (0: the engine does not say): the router's KV room.
    kv_capacity_tokens: int = Field(default=0, ge=0)
    prefix_hit_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    draining: bool = False
    # What it runs of a request (`SY_WORKER_ROLE`, #39): `both` (all of it), or one stage
    # of a disaggregated pool: `prefill` (the prompt's KV) or `decode` (the answer).
    role: WorkerRole = "both"
    # Where its GPU sits, `host/socket/switch` (`SY_WORKER_TOPOLOGY`; scheduling/links.py):
    # a decode stage goes to the decode worker nearest its prefill worker. Empty: unknown.
    topology: Annotated[str, Field(pattern=r"^$|" + LOCATION_PATTERN)] = ""


class Assignment(Model):
    """KV `fleet_assignments` value (key = `<pool>.p<k>`): who owns a partition."""

    v: int = 1
    pool: Token
    partition: int = Field(ge=0)
    worker: Token
    at: UnixTime
    reason: Literal["initial", "dead", "drain", "spill", "static"] = "initial"


def assignment_key(pool: str, partition: int) -> str:
    """The key of partition `partition` of `pool` in KV `fleet_assignments`."""
    return f"{pool}.p{partition}"


class TenantStatus(Model):
    """KV `fleet_tenants` value (key `<tenant>.<router>`, see `tenant_status_key`): one
    tenant at one router, written each second by every router for the edge's console."""

    v: int = 1
    tenant: TenantId
    router: Token
    at: UnixTime
    # Quota (per minute) and what of it is spent now: the bucket's capacity minus its
    # level. Output tokens count `max_tokens` reserved until the request finishes.
    itpm: int = Field(ge=1)
    otpm: int = Field(ge=1)
    input_used: float = Field(ge=0)
    output_used: float = Field(ge=0)
    inflight: int = Field(ge=0)
    max_concurrency: int = Field(ge=1)
    queued: int = Field(ge=0)
    queued_tokens: int = Field(ge=0)
    max_queued_tokens: int = Field(ge=1)
    # How long the oldest of its queued requests has waited (0 when none waits).
    oldest_wait: float = Field(ge=0)
    vtc: float  # its virtual token counter in the fair queue


def tenant_status_key(tenant: str, router: str) -> str:
    """The tenant first, so one tenant's rows are read by key filter alone."""
    return f"{tenant}.{router}"


class SessionRoute(Model):
    """KV `fleet_sessions` value (key from `session_key`): the worker a session's requests
    go to, so every router sends a session to the same worker and a restarted router
    remembers. The entry expires with the bucket's TTL unless a router rewrites it; routers
    rewrite a live session's entry when half of that has passed."""

    v: int = 1
    pool: Token
    tenant: TenantId
    session: SessionId
    worker: Token
    at: UnixTime  # when this entry was written
    reason: Literal["new", "dead", "drain", "load"] = "new"


def session_key(pool: str, tenant: str, session: str) -> str:
    """`<pool>.<tenant>.<session>`: a session id is the tenant's own (two tenants may both
    have an "episode-1"), and all three are tokens, which KV keys allow as is."""
    return f"{pool}.{tenant}.{session}"


class RouterLease(Model):
    """KV `fleet_router` value (key `router_lease_key(pools)`): the router that admits and
    dispatches for these pools; rewritten by its holder, gone with the bucket's TTL if not."""

    v: int = 1
    router: Token
    since: UnixTime  # when it took the lease
    at: UnixTime  # when it last renewed it


def router_lease_key(pools: list[str]) -> str:
    """One lease per set of pools: routers serving the same pools are one group (a router
    for other pools, e.g. a test's private pool, is not its rival)."""
    return "pools." + "-".join(sorted(set(pools)))
