"""Tenant label capping, the worker's vLLM-named engine exporter, and the router's queue
gauges, on real prometheus_client registries."""

from __future__ import annotations

import random

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, generate_latest

from services.router import metrics as router_metrics
from services.worker.metrics import EngineStatsExporter
from switchyard.engines.base import EngineStats
from switchyard.metrics import OTHER_TENANTS, TenantLabel

pytestmark = pytest.mark.unit

VLLM_NAMES = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
)


# -- TenantLabel ----------------------------------------------------------------------


def test_first_tenants_get_their_own_label_then_other() -> None:
    labels = TenantLabel(2)
    assert [labels(t) for t in ("a", "b", "c", "a", "d")] == ["a", "b", OTHER_TENANTS, "a",
                                                                OTHER_TENANTS]  # fmt: skip


def test_live_series_stay_bounded_whatever_tenants_appear() -> None:
    registry = CollectorRegistry()
    requests = Counter("r_total", "", ["tenant"], registry=registry)
    labels = TenantLabel(5, watched=[requests])
    rng = random.Random(7)
    for i in range(20_000):
        # A skewed mix: a few heavy tenants that change over time, and a long tail.
        heavy = f"heavy-{(i // 4000) * 3 + rng.randrange(3)}"
        tenant = heavy if rng.random() < 0.6 else f"tail-{rng.randrange(5000)}"
        requests.labels(labels(tenant)).inc()
    live = {
        s.labels["tenant"] for m in registry.collect() for s in m.samples if s.name == "r_total"
    }
    assert len(live) <= 5 + 1 and OTHER_TENANTS in live
    assert len(labels.traffic) <= labels.capacity  # memory bounded too
    assert any(t.startswith("heavy-1") for t in live)  # the late heavy tenants made it in
    assert (
        sum(s.value for m in registry.collect() for s in m.samples if s.name == "r_total") <= 20_000
    )  # demoted series are gone, never counted twice


def test_heavy_newcomer_displaces_the_lightest_and_its_series_go() -> None:
    registry = CollectorRegistry()
    tokens = Counter("t_tokens_total", "", ["tenant", "kind"], registry=registry)
    labels = TenantLabel(2, watched=[tokens])
    for tenant, n in (("small", 1), ("mid", 5)):
        for _ in range(n):
            tokens.labels(labels(tenant), "in").inc()
    assert registry.get_sample_value("t_tokens_total", {"tenant": "small", "kind": "in"}) == 1
    # `big` is `other` until its traffic is more than twice the lightest labelled one's.
    assert labels("big") == OTHER_TENANTS
    assert labels("big") == OTHER_TENANTS
    assert labels("big") == "big"  # 3 > 2 * 1
    assert labels.labelled == {"mid", "big"}
    assert labels.peek("small") == OTHER_TENANTS
    assert registry.get_sample_value("t_tokens_total", {"tenant": "small", "kind": "in"}) is None
    assert registry.get_sample_value("t_tokens_total", {"tenant": "mid", "kind": "in"}) == 5


def test_no_flapping_between_equal_tenants() -> None:
    labels = TenantLabel(1)
    outcomes = [labels(t) for _ in range(50) for t in ("a", "b")]
    assert set(outcomes[0::2]) == {"a"} and set(outcomes[1::2]) == {OTHER_TENANTS}


def test_tenant_label_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="top_n"):
        TenantLabel(0)
    with pytest.raises(ValueError, match="margin"):
        TenantLabel(3, margin=0.5)
    untenanted = Counter("u_total", "", ["route"], registry=CollectorRegistry())
    with pytest.raises(ValueError, match="no tenant label"):
        TenantLabel(3, watched=[untenanted])


# -- the worker's engine exporter -----------------------------------------------------


def test_exporter_serves_vllm_names_with_vllm_labels() -> None:
    registry = CollectorRegistry()
    exporter = EngineStatsExporter()
    assert exporter.install("sim", registry)
    exporter.update("agent", EngineStats(0.42, waiting=3, running=5, prefix_queried_tokens=100,
                                         prefix_hit_tokens=60))  # fmt: skip
    labels = {"model_name": "agent", "engine": "0"}
    get = registry.get_sample_value
    assert get("vllm:kv_cache_usage_perc", labels) == 0.42
    assert get("vllm:num_requests_waiting", labels) == 3
    assert get("vllm:num_requests_running", labels) == 5
    assert get("vllm:prefix_cache_queries_total", labels) == 100
    assert get("vllm:prefix_cache_hits_total", labels) == 60
    assert get("vllm:num_preemptions_total", labels) is None  # the engine did not say


def test_preemptions_are_served_when_the_engine_counts_them() -> None:
    registry = CollectorRegistry()
    exporter = EngineStatsExporter()
    exporter.install("sim", registry)
    exporter.update("agent", EngineStats(preemptions=4))
    labels = {"model_name": "agent", "engine": "0"}
    assert registry.get_sample_value("vllm:num_preemptions_total", labels) == 4


def test_exporter_exposition_matches_vllm_style_collectors() -> None:
    """What the worker serves reads like what vLLM's Gauge/Counter objects serve."""
    ours = CollectorRegistry()
    exporter = EngineStatsExporter()
    exporter.install("sim", ours)
    exporter.update("agent", EngineStats(0.25, 1, 2, 30, 20, preemptions=7))
    theirs = CollectorRegistry()
    labels = ["model_name", "engine"]
    values = {"vllm:kv_cache_usage_perc": 0.25, "vllm:num_requests_waiting": 1,
              "vllm:num_requests_running": 2}  # fmt: skip
    for family in exporter.describe():
        if family.type == "gauge":
            Gauge(family.name, family.documentation, labels, registry=theirs).labels(
                "agent", "0"
            ).set(values[family.name])
        else:
            n = {"vllm:prefix_cache_queries": 30, "vllm:num_preemptions": 7}.get(family.name, 20)
            Counter(family.name, family.documentation, labels, registry=theirs).labels(
                "agent", "0"
            ).inc(n)

    def lines(registry: CollectorRegistry) -> list[str]:
        text = generate_latest(registry).decode()
        return [line for line in text.splitlines() if "_created" not in line]

    assert lines(ours) == lines(theirs)


def test_exporter_is_not_installed_for_vllm_whose_engine_registers_the_names() -> None:
    registry = CollectorRegistry()
    exporter = EngineStatsExporter()
    assert not exporter.install("vllm", registry)
    # What vLLM's PrometheusStatLogger then registers in the same registry must not clash.
    labels = ["model_name", "engine"]
    Gauge("vllm:kv_cache_usage_perc", "", labels, registry=registry).labels("m", "0").set(0.5)
    Counter("vllm:prefix_cache_queries", "", labels, registry=registry)
    assert registry.get_sample_value(
        "vllm:kv_cache_usage_perc", {"model_name": "m", "engine": "0"}
    ) == 0.5  # fmt: skip


def test_exporter_steps_aside_when_the_names_are_taken() -> None:
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_waiting", "", ["model_name", "engine"], registry=registry)
    exporter = EngineStatsExporter()
    assert not exporter.install("sim", registry)  # no duplicate-timeseries error
    assert "vllm:kv_cache_usage_perc" not in generate_latest(registry).decode()


def test_a_vllm_collector_after_ours_would_clash_which_is_why_vllm_is_excluded() -> None:
    registry = CollectorRegistry()
    assert EngineStatsExporter().install("sim", registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Gauge("vllm:kv_cache_usage_perc", "", ["model_name", "engine"], registry=registry)


def test_exporter_install_is_idempotent_and_empty_before_the_first_beat() -> None:
    registry = CollectorRegistry()
    exporter = EngineStatsExporter()
    assert exporter.install("llamacpp", registry) and exporter.install("llamacpp", registry)
    assert registry.get_sample_value(
        "vllm:kv_cache_usage_perc", {"model_name": "", "engine": "0"}
    ) is None  # fmt: skip


# -- router queue gauges --------------------------------------------------------------


def test_queue_gauges_sum_other_and_zero_emptied_tenants() -> None:
    labels = router_metrics.tenant_labels(1)
    gauges = router_metrics.QueueGauges(labels, every=0.0)
    labels("big")  # labelled; the others are `other`
    depths = {"big": 4, "x": 2, "y": 3}
    vtc = {"big": 10.0, "x": 7.0, "y": 9.0}
    gauges.record(depths, depths.__getitem__, vtc.__getitem__)

    def depth(label: str) -> float | None:
        return REGISTRY.get_sample_value("sy_router_queued_requests", {"tenant": label})

    assert depth("big") == 4 and depth(OTHER_TENANTS) == 5
    assert REGISTRY.get_sample_value("sy_router_virtual_tokens", {"tenant": "other"}) == 9.0
    gauges.record({"x": 1}, {"x": 1}.__getitem__, vtc.__getitem__)
    assert depth("big") == 0 and depth(OTHER_TENANTS) == 1


# -- the worker's heartbeat publishes them --------------------------------------------


async def test_heartbeat_of_a_sim_worker_exports_engine_state_under_vllm_names() -> None:
    """The real path: a started sim engine, the heartbeat's snapshot, the default registry
    a worker's /metrics serves."""
    from services.worker.heartbeat import snapshot
    from services.worker.settings import WorkerSettings
    from switchyard.engines.base import EngineRequest
    from switchyard.engines.sim import SimEngine, SimSettings

    engine = SimEngine(SimSettings(delay_scale=0.0))
    await engine.start()
    try:
        prompt = "the same long system prompt " * 40
        for i in range(2):  # the second run finds the first one's prefix in the cache
            async for _ in engine.generate(EngineRequest(request_id=f"r{i}", prompt=prompt)):
                pass
        settings = WorkerSettings(worker_id="w-metrics", pool="metricspool", engine="sim")
        beat = snapshot(settings, engine, [1, 2], queued=0, draining=False)
    finally:
        await engine.close()
    labels = {"model_name": "metricspool", "engine": "0"}
    get = REGISTRY.get_sample_value
    queried = get("vllm:prefix_cache_queries_total", labels)
    hits = get("vllm:prefix_cache_hits_total", labels)
    assert queried is not None and hits is not None and 0 < hits < queried
    assert get("vllm:kv_cache_usage_perc", labels) == beat.kv_cache_usage
    assert get("vllm:num_requests_running", labels) == 0
    assert get("vllm:num_preemptions_total", labels) == 0  # the sim never preempts
    info = {"worker": "w-metrics", "pool": "metricspool", "backend": "sim"}
    assert get("sy_worker_info", info) == 1
