"""Router metrics. Tenant labels are limited to the top N by traffic; the rest are `other`."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from prometheus_client import Counter, Gauge, Histogram

from switchyard.metrics import LATENCY_BUCKETS, OTHER_TENANTS, TenantLabel

QUEUE_DEPTH = Gauge(
    "sy_router_queued_requests", "Requests queued in the router, by tenant label", ["tenant"]
)
QUEUE_WAIT = Histogram(
    "sy_router_queue_wait_seconds",
    "Admission to dispatch on WORK",
    ["tenant"],
    buckets=LATENCY_BUCKETS,
)
ADMITTED_TOKENS = Counter(
    "sy_router_admitted_tokens_total",
    "Tokens admitted: kind input, or output (max_tokens reserved)",
    ["tenant", "kind"],
)
REJECTED_TOKENS = Counter(
    "sy_router_rejected_tokens_total",
    "Tokens of refused requests (input + max_tokens), by error code",
    ["tenant", "reason"],
)
VTC = Gauge(
    "sy_router_virtual_tokens", "Virtual token counter (VTC) of the tenant label; `other`: "
    "the largest of its tenants", ["tenant"],
)  # fmt: skip
PLACEMENT = Counter(
    "sy_router_placement_decisions_total",
    "Partition moves between workers: initial / dead / drain / spill",
    ["decision"],
)
# Why each dispatched request went to its worker (scheduling/affinity.py): sticky (its
# session's worker), new (a new session), prefix (no session: by prompt prefix and load),
# dead / drain / load (its session moved).
ROUTE = Counter(
    "sy_router_route_decisions_total",
    "Per-request worker choices: sticky / new / prefix / dead / drain / load",
    ["pool", "reason"],
)
# How far each decode stage's KV travelled from its prefill worker (#39,
# scheduling/links.py): PIX (one PCIe switch), NODE (one socket), SYS (across sockets, or
# a machine whose sockets nobody named), NET (other machines, or a location not given).
DECODE_REQUESTS = Counter(
    "sy_router_decode_requests_total",
    "Decode stages dispatched, by the link their KV crosses: PIX / NODE / SYS / NET",
    ["pool", "link"],
)
PARTITIONS = Gauge(
    "sy_router_partitions", "Partitions the router assigns to each worker", ["pool", "worker"]
)
TIME_IN_ROUTER = Histogram(
    "sy_router_request_duration_seconds", "REQ delivery to WORK publish acked",
    buckets=LATENCY_BUCKETS,
)  # fmt: skip
# ResultStatus of requests the router answered itself: stale / superseded / expired /
# rejected / cancelled.
ANSWERED = Counter(
    "sy_router_dropped_requests_total", "Requests answered by the router without running them",
    ["status"],
)  # fmt: skip
for _status in ("stale", "superseded", "expired", "rejected", "cancelled"):  # at 0: a series
    ANSWERED.labels(_status)


def tenant_labels(top_n: int) -> TenantLabel:
    """The router's tenant labels; a demoted tenant's series leave every tenant metric."""
    return TenantLabel(
        top_n, watched=[QUEUE_DEPTH, QUEUE_WAIT, ADMITTED_TOKENS, REJECTED_TOKENS, VTC]
    )


class QueueGauges:
    """Sets the queue gauges per tenant label from the whole queue, at most every `every` s.

    Per-request updates could not do this: the `other` label stands for many tenants, so its
    depth is a sum over all of them, and a tenant whose queue emptied must read 0.
    """

    def __init__(self, labels: TenantLabel, every: float = 0.5) -> None:
        self.labels = labels
        self.every = every
        self.last = 0.0
        self.shown: set[str] = set()

    def record(
        self, tenants: Iterable[str], depth: Callable[[str], int], vtc: Callable[[str], float]
    ) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        depths: dict[str, int] = defaultdict(int)
        counters: dict[str, float] = defaultdict(float)
        for tenant in tenants:
            label = self.labels.peek(tenant)
            depths[label] += depth(tenant)
            counters[label] = max(counters[label], vtc(tenant))
        # A demoted tenant's series were removed with it: do not bring them back as zeros.
        live = (self.shown & (self.labels.labelled | {OTHER_TENANTS})) - depths.keys()
        for label in live:
            QUEUE_DEPTH.labels(label).set(0)
        for label, n in depths.items():
            QUEUE_DEPTH.labels(label).set(n)
            VTC.labels(label).set(counters[label])
        self.shown = live | depths.keys()
