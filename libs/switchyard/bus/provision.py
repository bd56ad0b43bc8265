"""Declarative provisioning of streams, consumers and KV buckets.

Idempotent: running it again changes nothing. A setting the server can update in
place (age, sizes, description) is updated; one it cannot (retention, storage),
or subjects that differ, is reported as a `ProvisioningError` naming each field,
because silently recreating a stream would delete its messages. Replicas and
placement the server can change online, but doing so copies every message of a
live stream between nodes, so it happens only when asked (`rescale=True`,
`sy provision --rescale`); otherwise a difference is an error too.
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
    Placement,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import (
    APIError,
    BadRequestError,
    BucketNotFoundError,
    NotFoundError,
    ServerError,
)

from switchyard.bus.topology import BucketSpec, ConsumerSpec, StreamSpec, Topology
from switchyard.errors import ProvisioningError

Action = Literal["created", "unchanged", "updated"]
# What the server answers a config it will not apply (not a transient 503).
REFUSED = (BadRequestError, ServerError)


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


def _placement(tags: tuple[str, ...]) -> Placement | None:
    return Placement(tags=list(tags)) if tags else None


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
        num_replicas=spec.replicas,
        placement=_placement(spec.placement_tags),
    )


def _close(a: float | None, b: float | None) -> bool:
    return abs((a or 0.0) - (b or 0.0)) < 1e-3


def _refused(what: str, exc: APIError) -> ProvisioningError:
    """The server's refusal, with the usual cause named (replicas on a single server)."""
    hint = ""
    if "non-clustered" in (exc.description or "") or "insufficient resources" in (
        exc.description or ""
    ):
        hint = (
            ": more replicas than the JetStream cluster has servers (a single server holds "
            "one copy: SY_REPLICAS=1; R3 needs a cluster of at least 3, e.g. `sy nats --cluster 3`)"
        )
    return ProvisioningError(f"the server refused {what}: {exc.description}{hint}")


def _placement_tags(placement: Placement | None) -> list[str]:
    return sorted(placement.tags or []) if placement is not None else []


def _layout(
    what: str, have_replicas: int | None, have_tags: list[str], spec: StreamSpec | BucketSpec,
    rescale: bool,
) -> list[str]:  # fmt: skip
    """How `what`'s copies differ from `spec`: raises unless a rescale was asked for."""
    changed = []
    if (have_replicas or 1) != spec.replicas:
        changed.append(f"replicas {have_replicas or 1} -> {spec.replicas}")
    if have_tags != sorted(spec.placement_tags):
        changed.append(f"placement tags {have_tags} -> {sorted(spec.placement_tags)}")
    if changed and not rescale:
        raise ProvisioningError(
            f"{what} is laid out differently from its declaration ({'; '.join(changed)}). "
            "Changing it copies every message between servers: run `sy provision --rescale` "
            "to do it deliberately, or set SY_REPLICAS / SY_STREAM_REPLICAS to match."
        )
    return changed


async def ensure_stream(js: JetStreamContext, spec: StreamSpec, rescale: bool = False) -> Change:
    wanted = stream_config(spec)
    try:
        info = await js.stream_info(spec.name)
    except NotFoundError:
        try:
            await js.add_stream(wanted)
        except REFUSED as exc:
            raise _refused(f"stream {spec.name}", exc) from exc
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
    stream = f"stream {spec.name}"
    drift += _layout(stream, have.num_replicas, _placement_tags(have.placement), spec, rescale)
    if not drift:
        return Change("stream", spec.name, "unchanged")
    try:
        await js.update_stream(wanted)
    except REFUSED as exc:
        raise _refused(f"the update of {stream}", exc) from exc
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


async def ensure_bucket(js: JetStreamContext, spec: BucketSpec, rescale: bool = False) -> Change:
    try:
        kv = await js.key_value(spec.name)
        status = await kv.status()
    except BucketNotFoundError:
        try:
            await js.create_key_value(
                KeyValueConfig(
                    bucket=spec.name,
                    description=spec.description,
                    history=spec.history,
                    ttl=spec.ttl or None,
                    storage=StorageType.FILE,
                    replicas=spec.replicas,
                    placement=_placement(spec.placement_tags),
                )
            )
        except REFUSED as exc:
            raise _refused(f"KV bucket {spec.name}", exc) from exc
        return Change("bucket", spec.name, "created")
    # A bucket is the stream KV_<name>: its TTL is the stream's max age (the server changes
    # it in place, entries stay), and its copies change the way a stream's do.
    config = status.stream_info.config
    what = f"KV bucket {spec.name}"
    changed = _layout(what, config.num_replicas, _placement_tags(config.placement), spec, rescale)
    if not _close(status.ttl, spec.ttl or None):
        changed.append(f"ttl {status.ttl or 0:g} -> {spec.ttl:g} s")
    if not changed:
        return Change("bucket", spec.name, "unchanged")
    config.max_age = spec.ttl or 0.0
    config.num_replicas = spec.replicas
    config.placement = _placement(spec.placement_tags)
    try:
        await js.update_stream(config)
    except REFUSED as exc:
        raise _refused(f"the update of {what}", exc) from exc
    return Change("bucket", spec.name, "updated", ", ".join(changed))


async def provision(
    js: JetStreamContext, topology: Topology, *, rescale: bool = False
) -> list[Change]:
    """Bring the server in line with `topology`; returns what was done, in order.
    `rescale` lets it change the replicas or placement of live streams and buckets."""
    changes = [await ensure_stream(js, s, rescale) for s in topology.streams]
    changes += [await ensure_consumer(js, c) for c in topology.consumers]
    changes += [await ensure_bucket(js, b, rescale) for b in topology.buckets]
    return changes
