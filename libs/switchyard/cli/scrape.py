"""`sy up --metrics-ports BASE`: every service of a local fleet serves `/metrics`, and a
Prometheus configuration that scrapes them is written beside the fleet's state.

The ports follow deploy/prometheus/prometheus.yml's convention (BASE 9100: preprocessor
9101, router 9102, ..., workers from 9110 in start order), so that file also works with
`switchyard-host` = this machine; the edge serves `/metrics` on its HTTP port. The
written `prometheus.yml` lists the same targets with the same `service` label and loads
the repository's alert rules, so what an operator runs here is what the dashboards and
alerts were written against: `prometheus --config.file <data dir>/prometheus/prometheus.yml`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import yaml

from switchyard.fleet import Service

# Port = BASE + offset (deploy/prometheus/prometheus.yml); workers from BASE + WORKERS_FROM.
OFFSETS = {"preprocessor": 1, "router": 2, "sqlflow": 3, "validator": 4, "executor": 5,
           "auditor": 6}  # fmt: skip
WORKERS_FROM = 10
SCRAPE_INTERVAL = "5s"  # as deployed: a step's histograms move within seconds
RULES = Path("deploy/prometheus/rules.yml")


def with_metrics_ports(procs: list[Service], base: int) -> list[Service]:
    """`procs` with `SY_METRICS_PORT` set by the convention; `base` 0 leaves them as they
    are (no `/metrics` but the edge's). ValueError when a port would pass 65535."""
    if not base:
        return procs
    served: list[Service] = []
    workers = 0
    for proc in procs:
        if proc.kind == "edge":  # on its HTTP port already
            served.append(proc)
            continue
        if proc.kind == "worker":
            port, workers = base + WORKERS_FROM + workers, workers + 1
        else:
            port = base + OFFSETS[proc.kind]
        if port > 65535:
            raise ValueError(f"--metrics-ports {base}: {proc.name} would need port {port}")
        served.append(dataclasses.replace(proc, env={**proc.env, "SY_METRICS_PORT": str(port)}))
    return served


def scrape_targets(procs: list[Service], *, https_edge: bool) -> list[dict[str, object]]:
    """Prometheus file_sd groups, one per service kind, labelled `service` as deployed."""
    groups: dict[str, list[str]] = {}
    for proc in procs:
        port = proc.env.get("SY_PORT" if proc.kind == "edge" else "SY_METRICS_PORT", "0")
        if port != "0":
            groups.setdefault(proc.kind, []).append(f"127.0.0.1:{port}")
    https = {"__scheme__": "https"} if https_edge else {}
    return [
        {"targets": targets, "labels": {"service": kind, **(https if kind == "edge" else {})}}
        for kind, targets in groups.items()
    ]


def write_prometheus_config(
    directory: Path, procs: list[Service], *, edge_ca: Path | None, repo: Path
) -> Path:
    """Write `targets.json` and `prometheus.yml` (which reads it and the repo's rules) into
    `directory`; return the config's path. An HTTPS edge is scraped trusting `edge_ca`."""
    directory.mkdir(parents=True, exist_ok=True)
    targets = directory / "targets.json"
    targets.write_text(json.dumps(scrape_targets(procs, https_edge=edge_ca is not None), indent=1))
    job: dict[str, object] = {"job_name": "switchyard",
                              "file_sd_configs": [{"files": [str(targets.resolve())]}]}  # fmt: skip
    if edge_ca is not None:
        job["tls_config"] = {"ca_file": str(edge_ca.resolve())}
    config = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": "15s"},
        "rule_files": [str((repo / RULES).resolve())],
        "scrape_configs": [job],
    }
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
