"""`sy up --metrics-ports`: the ports of deploy/prometheus/prometheus.yml's convention, and a
Prometheus configuration that promtool accepts and that scrapes exactly those ports."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from switchyard.cli.scrape import with_metrics_ports, write_prometheus_config
from switchyard.cli.up import FLEET, plan
from switchyard.fleet import Service
from tests.conftest import REPO

DEPLOYED = REPO / "deploy" / "prometheus" / "prometheus.yml"


def fleet(workers: int = 2) -> list[Service]:
    procs, _ = plan(FLEET, workers=workers, engine="sim", edge_port=8080)
    return procs


def test_ports_are_the_deployed_convention() -> None:
    procs = with_metrics_ports(fleet(), 9100)
    ports = {p.name: p.env.get("SY_METRICS_PORT") for p in procs}
    deployed = yaml.safe_load(DEPLOYED.read_text())["scrape_configs"]
    by_job = {job["job_name"]: job["static_configs"][0]["targets"] for job in deployed}
    for name in ("preprocessor", "router", "sqlflow", "validator", "executor", "auditor"):
        assert [f"switchyard-host:{ports[name]}"] == by_job[name], name
    workers = [int(p.env["SY_METRICS_PORT"]) for p in procs if p.kind == "worker"]
    assert workers == list(range(9110, 9110 + len(workers)))  # six: 3 pools x 2
    assert [f"switchyard-host:{w}" for w in workers] == by_job["worker"][: len(workers)]
    assert ports["edge"] is None  # /metrics on its HTTP port


def test_base_zero_changes_nothing_and_a_port_past_65535_is_refused() -> None:
    procs = fleet()
    assert with_metrics_ports(procs, 0) == procs
    with pytest.raises(ValueError, match=r"would need port 6553[6-9]"):
        with_metrics_ports(procs, 65530)


def test_the_written_config_scrapes_every_service(tmp_path: Path) -> None:
    procs = with_metrics_ports(fleet(), 9100)
    config = write_prometheus_config(tmp_path, procs, edge_ca=None, repo=REPO)
    targets = json.loads((tmp_path / "targets.json").read_text())
    by_service = {g["labels"]["service"]: g["targets"] for g in targets}
    assert by_service["edge"] == ["127.0.0.1:8080"]
    assert by_service["router"] == ["127.0.0.1:9102"]
    assert len(by_service["worker"]) == 6
    loaded = yaml.safe_load(config.read_text())
    assert Path(loaded["rule_files"][0]) == (REPO / "deploy/prometheus/rules.yml").resolve()
    if shutil.which("promtool"):
        checked = subprocess.run(["promtool", "check", "config", str(config)],
                                 capture_output=True, text=True, check=False)  # fmt: skip
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_an_https_edge_is_scraped_trusting_its_ca(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-")
    write_prometheus_config(tmp_path, with_metrics_ports(fleet(1), 9100), edge_ca=ca, repo=REPO)
    targets = json.loads((tmp_path / "targets.json").read_text())
    edge = next(g for g in targets if g["labels"]["service"] == "edge")
    assert edge["labels"]["__scheme__"] == "https"
    job = yaml.safe_load((tmp_path / "prometheus.yml").read_text())["scrape_configs"][0]
    assert job["tls_config"] == {"ca_file": str(ca.resolve())}
