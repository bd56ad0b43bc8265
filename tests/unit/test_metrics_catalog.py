"""The metrics catalog, the Grafana dashboard and the Prometheus rules agree with the
metrics the code really registers.

The exported names come from the metric objects the services' modules build (and the
registry they are registered in); every metric name in every PromQL expression of the
dashboard and the rules is extracted with a PromQL parser (promql-parser, the Rust
parser's Python binding) and must be one of them.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import REGISTRY

from switchyard.metrics_catalog import (
    BEGIN,
    END,
    METRIC_MODULES,
    CatalogError,
    MetricEntry,
    catalog,
    compare,
    parse_table,
    render_table,
)
from tests.conftest import REPO

# Series that Prometheus itself makes for every target; queries may use them.
PROMETHEUS_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})
# NVIDIA's DCGM exporter's (beside the workers; its default counters), on the GPU row.
DCGM_SERIES = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE",
                         "DCGM_FI_DEV_GPU_TEMP"})  # fmt: skip

pytestmark = pytest.mark.unit

DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "grafana" / "switchyard.json"
RULES = DEPLOY / "prometheus" / "rules.yml"
RULES_TEST = DEPLOY / "prometheus" / "rules_test.yml"
SCRAPE = DEPLOY / "prometheus" / "prometheus.yml"
CATALOG = DEPLOY / "metrics.md"

# Grafana's built-in interval variables stand where PromQL wants a duration.
GRAFANA_DURATIONS = re.compile(
    r"\$__(rate_interval|interval|range)|\$\{__(rate_interval|interval|range)\}"
)

REQUIRED_ALERTS = {
    # alert -> a metric its expression must read
    "SwitchyardTTFTOverSLO": "sy_worker_e2e_time_to_first_token_seconds_bucket",
    "SwitchyardDurationOverSLO": "sy_worker_e2e_duration_seconds_bucket",
    "SwitchyardRouterQueueGrowing": "sy_router_queued_requests",
    "SwitchyardKVCacheNearlyFull": "vllm:kv_cache_usage_perc",
    "SwitchyardWorkerErrorRate": "sy_worker_requests_total",
    "SwitchyardEdgeErrorRate": "sy_edge_requests_total",
    "SwitchyardStaleDrops": "sy_router_dropped_requests_total",
    "SwitchyardDeadLetters": "sy_bus_dead_letters_total",
    "SwitchyardExecutorKills": "sy_sql_killed_statements_total",
}


# -- the checker ----------------------------------------------------------------------


def metric_names(expr: str) -> set[str]:
    """Every metric name a PromQL expression selects (Grafana variables made durations)."""
    tree = promql_parser.parse(GRAFANA_DURATIONS.sub("5m", expr))
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for matcher in node.matchers.matchers:
                if matcher.name == "__name__":
                    if matcher.op != promql_parser.MatchOp.Equal:
                        raise ValueError(f"regex metric name in {expr!r}: cannot be checked")
                    names.add(matcher.value)

    promql_parser.walk(tree, visit)
    return names


def unknown_metrics(exprs: dict[str, str], exported: set[str]) -> dict[str, set[str]]:
    """Where -> the metric names it uses that the code does not export."""
    unknown = {where: metric_names(expr) - exported for where, expr in exprs.items()}
    return {where: names for where, names in unknown.items() if names}


def dashboard_exprs(dashboard: dict[str, Any]) -> dict[str, str]:
    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    exprs = {
        f"panel {p['title']!r} {t['refId']}": t["expr"]
        for p in panels(dashboard["panels"])
        for t in p.get("targets", [])
    }
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            exprs[f"variable {var['name']}"] = var["query"]
    return exprs


def rules_exprs(rules: dict[str, Any]) -> dict[str, str]:
    return {
        f"{g['name']}/{r.get('alert') or r.get('record')}": r["expr"]
        for g in rules["groups"]
        for r in g["rules"]
    }


@pytest.fixture(scope="module")
def entries() -> list[MetricEntry]:
    return catalog()


@pytest.fixture(scope="module")
def exported(entries: list[MetricEntry]) -> set[str]:
    return {s for e in entries for s in e.series()} | PROMETHEUS_SERIES | DCGM_SERIES


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    return dict(yaml.safe_load(RULES.read_text()))


# -- the catalog against the code -----------------------------------------------------


def test_catalog_document_matches_the_code(entries: list[MetricEntry]) -> None:
    problems = compare(CATALOG.read_text(), entries)
    assert not problems, "run `sy metrics catalog --write`:\n" + "\n".join(problems)
    assert len(entries) >= 45


def test_catalog_is_what_the_registry_holds(entries: list[MetricEntry]) -> None:
    """Importing the metric modules registered exactly the catalog's metrics (the worker's
    vLLM-named ones are registered only once a non-vLLM engine beats, and its `sy_gpu_*`
    have samples, so are collected, only once NVML has been read)."""
    registered = {
        f.name + ("_total" if f.type == "counter" else "")
        for f in REGISTRY.collect()
        if f.name.startswith(("sy_", "vllm:"))
    }
    listed = {e.name for e in entries}
    engine_stats = {e.name for e in entries if e.name.startswith(("vllm:", "sy_gpu_"))}
    assert listed - engine_stats <= registered
    assert registered - listed <= set(), f"registered but not in the catalog: {registered - listed}"


def test_every_metric_is_defined_in_a_metrics_module() -> None:
    """A metric built anywhere else would escape the catalog. (`vllm:*` names outside
    services/ are vLLM look-alikes of other servers, e.g. the sim server's, not ours.)"""
    constructors = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
    constructors |= {f"{kind}MetricFamily" for kind in ("Counter", "Gauge", "Histogram")}
    allowed = {Path(str(importlib.import_module(m).__file__)) for m in METRIC_MODULES.values()}
    strays = []
    for path in [*REPO.glob("services/**/*.py"), *REPO.glob("libs/switchyard/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if (
                name in constructors
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and first.value.startswith(
                    ("sy_", "vllm:") if path.is_relative_to(REPO / "services") else "sy_"
                )
                and path not in allowed
            ):
                strays.append(f"{path.relative_to(REPO)}:{node.lineno} {first.value}")
    assert allowed and all(p.exists() for p in allowed)
    assert not strays, strays


UNITS = ("_seconds", "_bytes", "_tokens", "_requests", "_partitions", "_statements",
         "_events", "_letters", "_answers", "_frames", "_hits", "_cancels", "_decisions",
         "_executions", "_validations", "_failures", "_info", "_in_flight", "_perc",
         "_waiting", "_running", "_queries", "_rejected", "_ratio", "_hertz", "_watts",
         "_celsius", "_bytes_per_second", "_preemptions")  # fmt: skip


def test_names_follow_prometheus_conventions(entries: list[MetricEntry]) -> None:
    bad = []
    for e in entries:
        if not re.fullmatch(r"(sy_[a-z]+|vllm:[a-z]+)_[a-z0-9_]+", e.name):
            bad.append(f"{e.name}: not sy_<service>_... in snake case")
        base = e.name.removesuffix("_total")
        if (e.type == "counter") != e.name.endswith("_total"):
            bad.append(f"{e.name}: `_total` is for counters, and every counter has it")
        if e.type == "histogram" and not e.name.endswith(("_seconds", "_bytes")):
            bad.append(f"{e.name}: histograms here are of seconds or bytes")
        if not base.endswith(UNITS):
            bad.append(f"{e.name}: no unit or counted thing at the end")
        if re.search(r"_(ms|milliseconds|kb|mb|percent)(_|$)", e.name):
            bad.append(f"{e.name}: not a base unit")
        if "tenant" in e.labels and e.service not in ("router", "worker", "edge"):
            bad.append(f"{e.name}: tenant label outside a TenantLabel-capped module")
    assert not bad, "\n".join(bad)


def test_catalog_parser_rejects_a_bad_document(entries: list[MetricEntry]) -> None:
    with pytest.raises(CatalogError, match="markers"):
        parse_table("no table here")
    table = render_table(entries)
    document = f"{BEGIN}\n{table}\n{END}"
    assert compare(document, entries) == []
    dropped = document.replace(f"| `{entries[0].name}` |", "| `sy_made_up_total` |")
    problems = compare(dropped, entries)
    assert f"exported but not in the catalog: {entries[0].name}" in problems
    assert "in the catalog but not exported: sy_made_up_total" in problems
    relabelled = document.replace("`tenant`, `kind`", "`tenant`")
    assert any(
        "sy_router_admitted_tokens_total: catalog says" in p for p in compare(relabelled, entries)
    )


# -- the checker itself ---------------------------------------------------------------


def test_metric_names_reads_promql_not_words() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, pool) (rate(sy_a_bucket{status=~"5..", '
        'x="sum"}[$__rate_interval]) * on (instance) group_left (pool) sy_b_info)) > 0.3 '
        "and deriv(sum(sy_c)[5m:30s]) > 0 or vector(0) + scalar(vllm:d offset 5m) "
        'or {__name__="sy_e", job="j"}'
    )
    assert metric_names(expr) == {"sy_a_bucket", "sy_b_info", "sy_c", "vllm:d", "sy_e"}
    with pytest.raises(ValueError):
        metric_names("sum(rate(x[5m]) by")
    with pytest.raises(ValueError, match="regex metric name"):
        metric_names('{__name__=~"sy_.*"}')


def test_checker_flags_a_made_up_metric(exported: set[str], dashboard: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(dashboard))
    broken["panels"][1]["targets"].append(
        {"refId": "Z", "expr": "sum(rate(sy_made_up_total[5m])) / sum(sy_worker_partitions)"}
    )
    unknown = unknown_metrics(dashboard_exprs(broken), exported)
    assert unknown.pop("panel 'Workers up' Z") == {"sy_made_up_total"}
    # What else the exported metrics alone do not cover: the recording rules' goodput.
    assert set().union(*unknown.values()) == {
        "pool:sy_worker_goodput_requests:rate5m",
        "pool:sy_worker_answers:rate5m",
    }
    rules = {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "vllm:made_up > 1"}]}]}
    assert unknown_metrics(rules_exprs(rules), exported) == {"g/A": {"vllm:made_up"}}
    # A histogram is exported as _bucket/_sum/_count, never under its bare name.
    bare = {"x": "rate(sy_worker_time_to_first_token_seconds[5m])"}
    assert unknown_metrics(bare, exported) == {"x": {"sy_worker_time_to_first_token_seconds"}}


# -- the dashboard --------------------------------------------------------------------


def test_dashboard_only_uses_exported_or_recorded_metrics(
    dashboard: dict[str, Any], exported: set[str], rules: dict[str, Any]
) -> None:
    """Exported by the code, or recorded by rules.yml (goodput: `sy metrics rules`)."""
    exprs = dashboard_exprs(dashboard)
    assert len(exprs) >= 40
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    assert "pool:sy_worker_goodput_requests:rate5m" in recorded
    assert unknown_metrics(exprs, exported | recorded) == {}


def test_dashboard_layout_and_datasource(dashboard: dict[str, Any]) -> None:
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert [r.split()[0] for r in rows] == ["Fleet", "Tenants", "Agent", "SQL", "Latency", "GPU"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            assert all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for t in panel["targets"])


def test_dashboard_uses_the_engine_metrics_by_their_vllm_names(dashboard: dict[str, Any]) -> None:
    used = set().union(*(metric_names(e) for e in dashboard_exprs(dashboard).values()))
    assert {"vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "vllm:num_requests_running",
            "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
            "vllm:num_preemptions_total"} <= used  # fmt: skip


def test_grafana_provisioning_points_at_the_dashboard() -> None:
    prov = DEPLOY / "grafana" / "provisioning"
    datasources = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())
    assert datasources["datasources"][0]["type"] == "prometheus"
    providers = yaml.safe_load((prov / "dashboards" / "switchyard.yml").read_text())
    assert providers["providers"][0]["type"] == "file"
    assert providers["providers"][0]["options"]["path"].startswith("/var/lib/grafana/dashboards")


# -- the rules ------------------------------------------------------------------------


def test_rules_only_use_exported_metrics(rules: dict[str, Any], exported: set[str]) -> None:
    exprs = rules_exprs(rules)
    assert unknown_metrics(exprs, exported) == {}


def test_rules_have_the_required_alerts(rules: dict[str, Any]) -> None:
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    for name, metric in REQUIRED_ALERTS.items():
        assert name in alerts, f"missing alert {name}"
        assert metric in metric_names(alerts[name]["expr"]), f"{name} does not read {metric}"
    for name, rule in alerts.items():
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{name}: no `for:`"
        assert rule["labels"]["severity"] in ("page", "ticket"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
    assert "0.9" in alerts["SwitchyardKVCacheNearlyFull"]["expr"]
    assert "0.01" in alerts["SwitchyardWorkerErrorRate"]["expr"]
    assert alerts["SwitchyardRouterQueueGrowing"]["for"] == "5m"


def test_scrape_config_loads_the_rules() -> None:
    config = yaml.safe_load(SCRAPE.read_text())
    assert config["rule_files"] == ["rules.yml"]
    jobs = {j["job_name"] for j in config["scrape_configs"]}
    assert jobs == {name for name in METRIC_MODULES if name != "all"} | {"dcgm"}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_and_unit_tests_the_rules() -> None:
    for args in (
        ["check", "rules", str(RULES)],
        ["check", "config", str(SCRAPE)],
        ["test", "rules", str(RULES_TEST)],
    ):
        done = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_rules_test_file_checks_every_required_alert() -> None:
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULES_TEST.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    missing = set(REQUIRED_ALERTS) - tested - {"SwitchyardEdgeErrorRate"}
    assert not missing, missing


def test_every_tenant_metric_is_capped_by_a_tenant_label(entries: list[MetricEntry]) -> None:
    """A tenant-labelled metric must be watched by its service's TenantLabel, so a demoted
    tenant's series leave it and its label values stay bounded."""
    from services.edge import metrics as edge
    from services.router import metrics as router
    from services.worker import metrics as worker

    watched = {
        m._name
        for labels in (edge.TENANTS, worker.TENANTS, router.tenant_labels(1))
        for m in labels.watched
    }
    tenant_metrics = {e.name.removesuffix("_total") for e in entries if "tenant" in e.labels}
    assert tenant_metrics and tenant_metrics <= watched
