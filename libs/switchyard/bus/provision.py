"""Declarative provisioning of streams, consumers and KV buckets.

Idempotent: running it again changes nothing. A setting the server can update in
place (age, sizes, description) is updated; one it cannot (retention, storage),
or subjects that differ, is reported as a `ProvisioningError` naming each field,
because silently recreating a stream would delete its messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BucketNotFoundError, NotFoundError

from switchyard.bus.topology import BucketSpec, ConsumerSpec, StreamSpec, Topology
from switchyard.errors import ProvisioningError

Action = Literal["created", "unchanged", "updated"]


@dataclass(frozen=True)
class Change:
    what: Literal["stream", "consumer", "bucket"]
    name: str
    action: Action
    detail: str = ""


def _retention(spec: StreamSpec) -> RetentionPolicy:
    return RetentionPolicy.LIMITS if spec.retention == "limits" else RetentionPolicy.WORK_QUEUE


def _storage(storage: str) -> StorageType:
    return StorageType.FILE if storage == "file" else StorageType.MEMORY


def stream_config(spec: StreamSpec) -> StreamConfig:
    return StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=_retention(spec),
        storage=_storage(spec.storage),
        max_age=spec.max_age,
        duplicate_window=spec.duplicate_window,
        max_msg_size=spec.max_msg_size,
        num_replicas=1,
    )


def _close(a: float | None, b: float | None) -> bool:
    return abs((a or 0.0) - (b or 0.0)) < 1e-3


async def ensure_stream(js: JetStreamContext, spec: StreamSpec) -> Change:
    wanted = stream_config(spec)
    try:
        info = await js.stream_info(spec.name)
    except NotFoundError:
        await js.add_stream(wanted)
        return Change("stream", spec.name, "created")
    have = info.config
    conflicts: list[str] = []
    if have.retention != wanted.retention:
        conflicts.append(
            f"retention is {_name(have.retention)}, declared {_name(wanted.retention)}"
        )
    if have.storage != wanted.storage:
        conflicts.append(f"storage is {_name(have.storage)}, declared {_name(wanted.storage)}")
    if sorted(have.subjects or []) != sorted(wanted.subjects or []):
        conflicts.append(f"subjects are {have.subjects}, declared {wanted.subjects}")
    if conflicts:
        raise ProvisioningError(
            f"stream {spec.name} exists with an incompatible config: "
            + "; ".join(conflicts)
            + ". Migrate or delete it deliberately (`nats stream rm`); it is not recreated "
            "automatically because that would lose its messages."
        )
    drift = []
    if not _close(have.max_age, wanted.max_age):
        drift.append("max_age")
    if not _close(have.duplicate_window, wanted.duplicate_window):
        drift.append("duplicate_window")
    if have.max_msg_size != wanted.max_msg_size:
        drift.append("max_msg_size")
    if (have.description or "") != (wanted.description or ""):
        drift.append("description")
    if not drift:
        return Change("stream", spec.name, "unchanged")
    await js.update_stream(wanted)
    return Change("stream", spec.name, "updated", ", ".join(drift))


def _name(value: Any) -> str:
    return str(getattr(value, "value", value))


def consumer_config(spec: ConsumerSpec) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=spec.durable,
        name=spec.durable,
        filter_subject=spec.filter_subject,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=spec.ack_wait,
        max_deliver=spec.max_deliver,
        max_ack_pending=spec.max_ack_pending,
    )


async def ensure_consumer(js: JetStreamContext, spec: ConsumerSpec) -> Change:
    wanted = consumer_config(spec)
    try:
        info = await js.consumer_info(spec.stream, spec.durable)
    except NotFoundError:
        await js.add_consumer(spec.stream, wanted)
        return Change("consumer", f"{spec.stream}/{spec.durable}", "created")
    have = info.config
    if have.filter_subject != spec.filter_subject:
        raise ProvisioningError(
            f"consumer {spec.stream}/{spec.durable} filters {have.filter_subject!r}, "
            f"declared {spec.filter_subject!r}; delete it deliberately to change its filter"
        )
    drift = []
    if not _close(have.ack_wait, wanted.ack_wait):
        drift.append("ack_wait")
    if have.max_deliver != wanted.max_deliver:
        drift.append("max_deliver")
    if have.max_ack_pending != wanted.max_ack_pending:
        drift.append("max_ack_pending")
    if not drift:
        return Change("consumer", f"{spec.stream}/{spec.durable}", "unchanged")
    # Creating a durable with the same name and a new config updates it in place.
    await js.add_consumer(spec.stream, wanted)
    return Change("consumer", f"{spec.stream}/{spec.durable}", "updated", ", ".join(drift))


async def ensure_bucket(js: JetStreamContext, spec: BucketSpec) -> Change:
    try:
        kv = await js.key_value(spec.name)
        status = await kv.status()
    except BucketNotFoundError:
        await js.create_key_value(
            KeyValueConfig(
                bucket=spec.name,
                description=spec.description,
                history=spec.history,
                ttl=spec.ttl or None,
                storage=StorageType.FILE,
            )
        )
        return Change("bucket", spec.name, "created")
    if not _close(status.ttl, spec.ttl or None):
        raise ProvisioningError(
            f"KV bucket {spec.name} has TTL {status.ttl}s, declared {spec.ttl}s; "
            "a bucket's TTL cannot change in place: delete it deliberately (it holds only "
            "soft state) and provision again"
        )
    return Change("bucket", spec.name, "unchanged")


async def provision(js: JetStreamContext, topology: Topology) -> list[Change]:
    """Bring the server in line with `topology`; returns what was done, in order."""
    changes = [await ensure_stream(js, s) for s in topology.streams]
    changes += [await ensure_consumer(js, c) for c in topology.consumers]
    changes += [await ensure_bucket(js, b) for b in topology.buckets]
    return changes
