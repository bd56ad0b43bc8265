"""The sim server's Prometheus metrics, under vLLM's own names and with vLLM's meaning.

Routers and dashboards that read a vLLM engine read these unchanged:

- `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total`: prompt tokens looked
  up in the prefix cache / found there (counters; hit rate = delta hits / delta queries);
- `vllm:num_requests_running`, `vllm:num_requests_waiting`: the engine's batch and queue;
- `vllm:kv_cache_usage_perc`: KV blocks in use, 0-1 (vLLM's name says perc, its value is a
  fraction);
- `vllm:request_success_total{finished_reason}`, `vllm:prompt_tokens_total`,
  `vllm:generation_tokens_total`.

Plus one of our own, `sim:busy_seconds_total`: the modelled engine time finished requests
used (`SimTimings.gpu`: each one's share of the steps it ran in), so a benchmark can compare
backends' load in GPU time, not only in requests.

Values are read from the engine when scraped (a collector, not counters kept beside it), so
they can never drift from what the engine did.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from switchyard.simserver.state import SimServerState


class SimCollector(Collector):
    """Reads the current engine (it may be replaced by a reset) at every scrape."""

    def __init__(self, server: SimServerState, model: str) -> None:
        self._server = server
        self._model = model

    def collect(self) -> Iterator[Metric]:
        engine, totals = self._server.engine, self._server.totals
        stats = engine.stats()
        labels = ["model_name"]
        value = [self._model]

        def counter(name: str, doc: str, v: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(value, v)
            return family

        def gauge(name: str, doc: str, v: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(value, v)
            return family

        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_queried_tokens,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            stats.prefix_hit_tokens,
        )
        yield gauge("vllm:num_requests_running", "Requests in model execution.", stats.running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be processed.", stats.waiting)
        yield gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
            stats.kv_cache_usage,
        )  # fmt: skip
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.",
            labels=[*labels, "finished_reason"],
        )  # fmt: skip
        for reason, n in sorted(totals.finished.items()):
            success.add_metric([*value, reason], n)
        yield success
        yield counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", totals.prompt_tokens
        )
        yield counter(
            "vllm:generation_tokens", "Number of generation tokens processed.",
            totals.generation_tokens,
        )  # fmt: skip
        yield counter(
            "sim:busy_seconds",
            "Modelled service time (prefill + decode) of finished requests (simulator).",
            totals.busy_seconds,
        )
