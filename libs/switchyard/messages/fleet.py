"""Fleet state kept in KV buckets: worker heartbeats and partition assignments."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from switchyard.envelope import Model, ShortText, Token, UnixTime


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
    prefix_hit_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    draining: bool = False


class Assignment(Model):
    """KV `fleet_assignments` value (key = `<pool>.p<k>`): who owns a partition."""

    v: int = 1
    pool: Token
    partition: int = Field(ge=0)
    worker: Token
    at: UnixTime
    reason: Literal["initial", "dead", "drain", "spill", "static"] = "initial"
