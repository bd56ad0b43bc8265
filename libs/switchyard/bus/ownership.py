"""Who sends and who receives on every subject of the fleet, declared once.

`FLOWS`: per channel of `proto/asyncapi.yaml` and subject pattern (spelled as the NATS
permission files spell it), who publishes there and who subscribes (core NATS). `PULLS`:
which service owns each durable consumer of `topology`; `READS`: which service reads a
stream or KV bucket besides (`info`, `get` by key or last message, `watch` through an
ordered consumer). `sy proto` writes AsyncAPI's sent-by/received-by from these, and
tests/unit/test_nats_permissions.py holds every service user of compose/nats-auth.conf
to exactly what `grants` derives from them (and ARCHITECTURE.md's service table to them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from switchyard import subjects
from switchyard.bus.topology import (
    ASSIGNMENTS_BUCKET,
    IDEMPOTENCY_BUCKET,
    ROUTER_BUCKET,
    ROUTER_DURABLE,
    SESSIONS_BUCKET,
    TENANTS_BUCKET,
    WINDOWS_BUCKET,
    WORKERS_BUCKET,
    ConsumerSpec,
    Topology,
)

Service = Literal[
    "edge", "preprocessor", "router", "worker", "sqlflow", "validator", "executor", "auditor"
]
# Senders and receivers that are no service user of nats-auth.conf: a client publishing on
# NATS with an account of its own, and operators (`sy replay`, `sy trace`: the admin user).
Actor = Service | Literal["client", "operator"]
Op = Literal["info", "get", "watch"]
KV_READ: tuple[Op, ...] = ("info", "get")  # `js.key_value()` and `kv_keys` ask INFO, then get
INBOX = "_INBOX.>"  # someone's reply inbox; each service reads only its own (`inbox`)


@dataclass(frozen=True)
class Flow:
    channel: str  # the `proto.CHANNELS` name this is part of
    subject: str
    senders: tuple[Actor, ...] = ()
    receivers: tuple[Actor, ...] = ()  # subscribers; a durable's owner is in PULLS
    replies: bool = False  # request/reply: receivers answer on the requester's inbox


@dataclass(frozen=True)
class Pull:
    service: Service
    stream: str
    durable: str  # "*": every durable of the stream (a worker pulls the partitions it owns)

    def owns(self, consumer: ConsumerSpec) -> bool:
        return consumer.stream == self.stream and self.durable in ("*", consumer.durable)


@dataclass(frozen=True)
class Read:
    service: Service
    stream: str  # a KV bucket's stream is KV_<bucket>
    ops: tuple[Op, ...]


def _kv(bucket: str) -> str:
    """Every key of a KV bucket, as its writers publish them."""
    return f"$KV.{bucket}.>"


def _kvs(bucket: str) -> str:
    """The stream that keeps a KV bucket."""
    return f"KV_{bucket}"


FLOWS: tuple[Flow, ...] = (
    Flow("agentIn", "agent.in.*", ("edge", "client")),
    Flow("sqlIn", "sql.in.*", ("edge", "client")),
    Flow("llmIn", "llm.in.*", ("client", "operator")),
    Flow("llmEdge", "llm.edge.*", ("edge",)),
    Flow("req", "req.agent.*", ("preprocessor",)),
    Flow("req", "req.llm.*", ("edge", "preprocessor")),
    Flow("req", "req.sql.*", ("sqlflow",)),  # the model calls of a question
    # A prefill worker hands its request's decode stage back to the router (#39).
    Flow("req", "req.*.*", ("worker",)),
    Flow("work", "work.*.*", ("router",)),
    # Refusals (router), answers (worker), rejected steps and chats (preprocessor), answers
    # of questions (sqlflow); the router settles admission on every result, the edge waits
    # for a retried Idempotency-Key's.
    Flow("res", "res.*.*", ("router", "worker")),
    Flow("res", "res.agent.*", ("preprocessor",)),
    Flow("res", "res.llm.*", ("preprocessor",)),
    Flow("res", "res.sql.*", ("sqlflow",)),
    Flow("res", subjects.RES_ALL, (), ("edge", "router", "operator")),
    Flow("audit", "audit.sql.*", ("sqlflow", "validator", "executor")),
    Flow("audit", "audit.review.*", ("edge",)),  # the console's review requests
    # Every pull loop dead-letters what it gives up on (`bus.consumer.dead_letter`).
    Flow("deadLetter", "dlq.>", ("preprocessor", "router", "worker", "sqlflow", "auditor"),
         ("operator",)),
    Flow("replyInbox", INBOX, ("worker", "router", "preprocessor"), ("edge", "client")),
    Flow("sqlReplyInbox", INBOX, ("sqlflow",), ("edge", "client")),
    Flow("cancel", subjects.CANCEL_ALL, ("edge", "sqlflow", "client"),
         ("router", "worker", "sqlflow")),
    Flow("supersede", subjects.SUPERSEDE_ALL, ("router",), ("router", "worker")),
    Flow("sqlValidate", subjects.SQL_VALIDATE, ("sqlflow",), ("validator",), replies=True),
    Flow("sqlExecute", subjects.SQL_EXECUTE, ("sqlflow",), ("executor",), replies=True),
    Flow("fleetWorkers", _kv(WORKERS_BUCKET), ("worker",)),
    Flow("fleetAssignments", _kv(ASSIGNMENTS_BUCKET), ("router",)),
    Flow("fleetSessions", _kv(SESSIONS_BUCKET), ("router",)),
    Flow("fleetTenants", _kv(TENANTS_BUCKET), ("router",)),
    Flow("fleetRouter", _kv(ROUTER_BUCKET), ("router",)),
    Flow("idempotency", _kv(IDEMPOTENCY_BUCKET), ("edge",)),
    Flow("agentWindows", _kv(WINDOWS_BUCKET), ("preprocessor",)),
)  # fmt: skip

PULLS: tuple[Pull, ...] = (
    Pull("preprocessor", "INGRESS", "preprocessor-chat"),
    Pull("preprocessor", "INGRESS", "preprocessor-agent"),
    Pull("sqlflow", "INGRESS", "sqlflow"),
    Pull("router", "REQ", ROUTER_DURABLE),
    Pull("worker", "WORK", "*"),
    Pull("auditor", "AUDIT", "auditor"),
)

READS: tuple[Read, ...] = (
    # /readyz: the streams a request crosses; a retried Idempotency-Key's result on RES.
    Read("edge", "INGRESS", ("info",)),
    Read("edge", "REQ", ("info",)),
    Read("edge", "WORK", ("info",)),
    Read("edge", "RES", ("info", "watch")),
    Read("edge", _kvs(IDEMPOTENCY_BUCKET), KV_READ),
    Read("edge", _kvs(WORKERS_BUCKET), KV_READ),  # /readyz and the console: listed by `kv_keys`
    Read("edge", _kvs(TENANTS_BUCKET), KV_READ),
    Read("preprocessor", _kvs(WINDOWS_BUCKET), KV_READ),
    # Results published while its connection was down, and a redelivered dispatch's.
    Read("router", "RES", ("info", "watch")),
    Read("router", _kvs(WORKERS_BUCKET), KV_READ),
    Read("router", _kvs(ASSIGNMENTS_BUCKET), KV_READ),
    Read("router", _kvs(TENANTS_BUCKET), KV_READ),  # usage, resumed on taking over the lease
    Read("router", _kvs(SESSIONS_BUCKET), (*KV_READ, "watch")),  # services/router/sessions.py
    Read("router", _kvs(ROUTER_BUCKET), KV_READ),
    Read("worker", _kvs(WORKERS_BUCKET), KV_READ),
    Read("worker", _kvs(ASSIGNMENTS_BUCKET), (*KV_READ, "watch")),  # in `kv` ownership mode
)

SERVICES: tuple[Service, ...] = get_args(Service)


def overlaps(a: str, b: str) -> bool:
    """Whether some subject matches both NATS subject patterns."""
    x, y = a.split("."), b.split(".")
    for p, q in zip(x, y, strict=False):
        if ">" in (p, q):
            return True
        if p != q and "*" not in (p, q):
            return False
    return len(x) == len(y)


def inbox(service: Service) -> str:
    """Where a service's replies, publish acks and consumer deliveries arrive
    (`Settings.nats_options` makes `_INBOX.<user>` its inbox prefix)."""
    return f"_INBOX.{service}.>"


def stored_in(topology: Topology) -> dict[str, tuple[str, ...]]:
    """Stream name -> its subjects, KV buckets' streams included."""
    streams = {s.name: s.subjects for s in topology.streams}
    return streams | {_kvs(b.name): (_kv(b.name),) for b in topology.buckets}


def senders(channel: str) -> tuple[Actor, ...]:
    return _unique(a for f in FLOWS if f.channel == channel for a in f.senders)


def receivers(channel: str, topology: Topology) -> tuple[Actor, ...]:
    """Its subscribers, the owners of the durables that consume it, and the services
    that read the stream it is kept in."""
    flows = [f for f in FLOWS if f.channel == channel]
    streams = stored_in(topology)
    pulled = [
        p.service
        for p in PULLS
        for c in topology.consumers
        if p.owns(c) and any(overlaps(c.filter_subject, f.subject) for f in flows)
    ]
    read = [
        r.service
        for r in READS
        if set(r.ops) & {"get", "watch"}
        and any(overlaps(s, f.subject) for s in streams[r.stream] for f in flows)
    ]
    return _unique([*(a for f in flows for a in f.receivers), *pulled, *read])


@dataclass(frozen=True)
class Grants:
    publish: frozenset[str]
    subscribe: frozenset[str]
    allow_responses: bool


def grants(service: Service) -> Grants:
    """The NATS permissions `service` needs, no more."""
    publish = {f.subject for f in FLOWS if service in f.senders}
    for p in (p for p in PULLS if p.service == service):
        publish |= {
            f"$JS.API.CONSUMER.MSG.NEXT.{p.stream}.{p.durable}",
            f"$JS.API.CONSUMER.INFO.{p.stream}.{p.durable}",
            f"$JS.ACK.{p.stream}.{p.durable}.>",
        }
    for r in (r for r in READS if r.service == service):
        s = r.stream
        if "info" in r.ops:
            publish.add(f"$JS.API.STREAM.INFO.{s}")
        if "get" in r.ops:
            publish |= {f"$JS.API.DIRECT.GET.{s}", f"$JS.API.DIRECT.GET.{s}.>",
                        f"$JS.API.STREAM.MSG.GET.{s}"}  # fmt: skip
        if "watch" in r.ops:  # an ordered consumer, flow-controlled
            publish |= {f"$JS.API.CONSUMER.CREATE.{s}", f"$JS.API.CONSUMER.CREATE.{s}.>",
                        f"$JS.API.CONSUMER.DELETE.{s}.*", f"$JS.API.CONSUMER.INFO.{s}.*",
                        f"$JS.FC.{s}.>"}  # fmt: skip
            if s.startswith("KV_"):  # nats-py's `KeyValue.watch` finds its stream by subject
                publish.add("$JS.API.STREAM.NAMES")
    received = {f.subject for f in FLOWS if service in f.receivers and f.subject != INBOX}
    return Grants(
        frozenset(publish),
        frozenset({inbox(service), *received}),
        any(f.replies and service in f.receivers for f in FLOWS),
    )


def _unique(actors: Iterable[Actor]) -> tuple[Actor, ...]:
    return tuple(dict.fromkeys(actors))  # first-seen order
