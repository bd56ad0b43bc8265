"""Prometheus metrics: one `/metrics` server per process (its probes beside it), shared
buckets, tenant labels, and the bus metrics every service exports. The catalog of every
metric is deploy/metrics.md."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, Counter, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics import MetricWrapperBase

from switchyard.probes import Probes

# Latency buckets from 1 ms to 60 s: agent steps live around 0.1-0.5 s, SQL runs to tens of s.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
    0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

OTHER_TENANTS = "other"
WSGIApp = Callable[[dict[str, Any], Any], Iterable[bytes]]

# Here rather than in bus/ so the consumer imports it without a cycle; every service that
# consumes JetStream can dead-letter, so every service exports it. `code` is an ErrorCode.
DEAD_LETTERS = Counter(
    "sy_bus_dead_letters_total", "Messages given up and stored on dlq.<subject>",
    ["stream", "code"],
)  # fmt: skip


def serve_metrics(
    port: int, registry: CollectorRegistry = REGISTRY, probes: Probes | None = None
) -> WSGIServer | None:
    """Start the HTTP server of `/metrics` on `port` (all interfaces), on threads of its
    own, with `probes`' paths (`switchyard.probes`) when given; port 0 disables it.
    Returns the server (`shutdown()` stops it), or None."""
    if not port:
        return None
    app = classic_text(make_wsgi_app(registry))
    if probes is not None:
        app = probes.wsgi(app)
    server = make_server("", port, app, ThreadingWSGIServer, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server


def classic_text(app: WSGIApp) -> WSGIApp:
    """`app` answering every scrape in Prometheus's text format, whatever it accepts.

    prometheus_client's OpenMetrics output (which Prometheus asks for first) writes a name
    with a colon as `vllm_x` on its samples but `vllm:x` on HELP/TYPE
    (prometheus/client_python#1177, open): every `vllm:*` series, vLLM's own and the
    worker's, would be stored under a name no dashboard or alert reads.
    """

    def text_only(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        return app({**environ, "HTTP_ACCEPT": "text/plain"}, start_response)

    return text_only


class _Quiet(WSGIRequestHandler):
    """No access log on stderr: Prometheus scrapes and probes poll every few seconds."""

    def log_message(self, format: str, *args: object) -> None:
        pass


class TenantLabel:
    """Maps a tenant to a metric label value: itself for the top `top_n` tenants by traffic,
    `other` for the rest, so a metric's tenant label has at most `top_n + 1` values at once.

    Traffic is counted in a table of at most `8 * top_n` tenants (the lightest entry makes
    room, as in the Space-Saving sketch), so memory is bounded whatever tenants appear. The
    first `top_n` tenants get a label at once; after that a tenant takes the place of the
    lightest labelled one only when its traffic is `margin` times larger, so labels do not
    flap. A demoted tenant's series are removed from the `watched` metrics (its counts go on
    under `other`); `rate()` treats the removal as the end of that series.
    """

    def __init__(
        self, top_n: int, *, watched: Iterable[MetricWrapperBase] = (), margin: float = 2.0
    ) -> None:
        if top_n < 1:
            raise ValueError(f"top_n must be at least 1, got {top_n}")
        if margin < 1.0:
            raise ValueError(f"margin must be at least 1, got {margin}")
        self.top_n = top_n
        self.margin = margin
        self.capacity = 8 * top_n
        self.traffic: dict[str, float] = {}
        self.labelled: set[str] = set()
        self.watched: list[MetricWrapperBase] = []
        for metric in watched:
            self.watch(metric)

    def watch(self, metric: MetricWrapperBase) -> None:
        """Remove a demoted tenant's series from `metric` (which must have a `tenant` label)."""
        if "tenant" not in metric._labelnames:
            raise ValueError(f"metric {metric._name} has no tenant label")
        self.watched.append(metric)

    def __call__(self, tenant: str, weight: float = 1.0) -> str:
        """Count `weight` of traffic for `tenant` and return its label value."""
        self._count(tenant, weight)
        if tenant in self.labelled:
            return tenant
        if len(self.labelled) < self.top_n:
            self.labelled.add(tenant)
            return tenant
        lightest = min(self.labelled, key=lambda t: self.traffic.get(t, 0.0))
        if self.traffic[tenant] > self.margin * self.traffic.get(lightest, 0.0):
            self.labelled.discard(lightest)
            self.labelled.add(tenant)
            self._forget(lightest)
            return tenant
        return OTHER_TENANTS

    def peek(self, tenant: str) -> str:
        """The label value of `tenant` now, without counting traffic."""
        return tenant if tenant in self.labelled else OTHER_TENANTS

    def _count(self, tenant: str, weight: float) -> None:
        if tenant not in self.traffic and len(self.traffic) >= self.capacity:
            # Space-Saving: the newcomer inherits the evicted count, an overestimate that
            # lets a heavy newcomer rise while keeping the table bounded.
            spare = [t for t in self.traffic if t not in self.labelled] or list(self.traffic)
            evicted = min(spare, key=self.traffic.__getitem__)
            self.traffic[tenant] = self.traffic.pop(evicted)
        self.traffic[tenant] = self.traffic.get(tenant, 0.0) + weight

    def _forget(self, tenant: str) -> None:
        for metric in self.watched:
            names = metric._labelnames
            at = names.index("tenant")
            for values in [v for v in metric._metrics if v[at] == tenant]:
                metric.remove(*values)
