"""The `/metrics` server answers in Prometheus's text format, so a `vllm:*` name arrives
whole whatever Prometheus asks for (prometheus/client_python#1177 mangles it in OpenMetrics)."""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

from switchyard.metrics import serve_metrics
from switchyard.ports import free_port

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
    port = serve_metrics(free_port(), registry)
    reply = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain")
    assert 'vllm:kv_cache_usage_perc{engine="0"} 0.5' in reply.text
