"""Router metrics. Tenant labels are limited to the top-N by traffic; the rest are `other`."""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import Counter, Gauge, Histogram

from switchyard.metrics import LATENCY_BUCKETS

QUEUE_DEPTH = Gauge("sy_router_queue_depth", "Requests queued in the router", ["tenant"])
QUEUE_WAIT = Histogram(
    "sy_router_queue_wait_seconds", "Admission to dispatch", ["tenant"], buckets=LATENCY_BUCKETS
)
ADMITTED_TOKENS = Counter("sy_router_admitted_tokens_total", "Tokens admitted", ["tenant", "kind"])
REJECTED_TOKENS = Counter("sy_router_rejected_tokens_total", "Tokens refused", ["tenant", "reason"])
VTC = Gauge("sy_router_vtc", "Virtual token counter", ["tenant"])
PLACEMENT = Counter(
    "sy_router_placement_total", "Placement decisions", ["decision"]
)  # keep / initial / dead / drain / spill
PARTITIONS = Gauge("sy_router_partitions", "Partitions per worker", ["pool", "worker"])
TIME_IN_ROUTER = Histogram(
    "sy_router_time_seconds", "REQ delivery to WORK publish acked", buckets=LATENCY_BUCKETS
)
ANSWERED = Counter("sy_router_answered_total", "Requests answered by the router", ["status"])


class TenantLabels:
    """Maps tenants to at most `top` label values by traffic seen so far."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.seen: Tally[str] = Tally()
        self.labelled: set[str] = set()

    def __call__(self, tenant: str) -> str:
        self.seen[tenant] += 1
        if tenant in self.labelled:
            return tenant
        if len(self.labelled) < self.top:
            self.labelled.add(tenant)
            return tenant
        return "other"
