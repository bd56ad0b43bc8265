"""The `/metrics` server answers in Prometheus's text format, so a `vllm:*` name arrives
whole whatever Prometheus asks for (prometheus/client_python#1177 mangles it in OpenMetrics),
and its probes' paths beside it (`switchyard.probes`)."""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

from switchyard.metrics import serve_metrics
from switchyard.ports import free_port
from switchyard.probes import Probes

PROMETHEUS_ACCEPT = (  # what Prometheus 2.42 sends on a scrape
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def test_a_colon_name_survives_a_scrape_that_asks_for_openmetrics() -> None:
    registry = CollectorRegistry()
    Gauge("vllm:kv_cache_usage_perc", "KV use", ["engine"], registry=registry).labels("0").set(0.5)
    # The library's own OpenMetrics output is the bug this server avoids (if this starts
    # failing, the upstream fix landed and `classic_text` can go).
    assert b"\nvllm_kv_cache_usage_perc{" in openmetrics(registry)
    port = free_port()
    server = serve_metrics(port, registry)
    assert server is not None
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        reply = httpx.get(url, headers={"Accept": PROMETHEUS_ACCEPT})
    finally:
        server.shutdown()
        server.server_close()
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain")
    assert 'vllm:kv_cache_usage_perc{engine="0"} 0.5' in reply.text


def test_probes_answer_json_beside_metrics() -> None:
    registry = CollectorRegistry()
    Gauge("sy_test_up", "up", registry=registry).set(1)
    probes = Probes()
    probes.add("readyz", "bus", lambda: "NATS disconnected (reconnecting)")
    port = free_port()
    server = serve_metrics(port, registry, probes)
    assert server is not None
    try:
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz")
        live = httpx.get(f"http://127.0.0.1:{port}/healthz")
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.shutdown()
        server.server_close()
    assert ready.status_code == 503 and ready.headers["content-type"] == "application/json"
    assert ready.json() == {"ok": False, "checks": {"bus": "NATS disconnected (reconnecting)"}}
    assert live.status_code == 200 and live.json() == {"ok": True, "checks": {}}
    assert metrics.status_code == 200 and "sy_test_up 1.0" in metrics.text
