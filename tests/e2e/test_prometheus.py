"""The dashboard and the alert rules, proven against a real Prometheus scraping a real fleet.

`sy up --engine sim --metrics-ports BASE` runs every service with its `/metrics` and
writes the Prometheus configuration that scrapes them (`switchyard.cli.scrape`); Debian's
`prometheus` (which `make test` installs for promtool) runs that very file. Load then goes
through every workload, including the refusals an on-call engineer watches (a bad frame,
a stale frame, a cancelled stream, a message no service can decode), and every expression
of deploy/grafana/switchyard.json and deploy/prometheus/rules.yml goes through
Prometheus's HTTP API: each must return a series. An alert's expression is checked without
its threshold (a healthy fleet fires none; what matters is that it reads series that exist).
The GPU panels read NVML and DCGM, which a machine without a GPU has not: they are left
out only when the workers said so (`worker.gpu_metrics_off`).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import yaml
from PIL import Image

from switchyard.ports import free_port
from tests.conftest import REPO
from tests.support.poll import until_blocking
from tests.support.upfleet import SY, UpFleet, fleet_env, run, sy_up

pytestmark = [
    pytest.mark.timeout(420),
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="no prometheus binary "
                       "(make test installs Debian's: deploy/local/ensure-promtool.sh)"),
]  # fmt: skip

DASHBOARD = REPO / "deploy" / "grafana" / "switchyard.json"
RULES = REPO / "deploy" / "prometheus" / "rules.yml"
KEY = {"Authorization": "Bearer sk-local-dev"}  # deploy/local/edge-keys.yaml: tenant `dev`
# Grafana's own variables, as it fills them on a dashboard of the last 30 minutes (the
# load, with its `sy sql ask` processes, takes over a minute).
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "15s", "$__range": "5m"}
OTPM = 2000
SCRAPE_S = 5  # switchyard.cli.scrape.SCRAPE_INTERVAL
SERIES_TIMEOUT = 120.0  # s: a 5 s scrape, and the rules' 30 s subqueries need two points
SHOWN_AFTER = 15.0  # s after the load: all of it in a 5 min window


def free_block(width: int = 20) -> int:
    """A base port whose next `width` ports are free (the convention's offsets)."""
    for _ in range(50):
        base = free_port()
        if base + width > 65000:
            continue
        try:
            for port in range(base + 1, base + width):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no block of free ports")


def png(colour: tuple[int, int, int]) -> str:
    out = io.BytesIO()
    Image.new("RGB", (320, 240), colour).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpFleet]:
    tmp = tmp_path_factory.mktemp("prometheus")
    # The dev key's tenant may reserve at most OTPM output tokens a minute: one chat asking
    # for more is refused by the router (the refused-tokens panel).
    policy = tmp / "tenants.yaml"
    policy.write_text(yaml.safe_dump({"default": {}, "tenants": {"dev": {"otpm": OTPM}}}))
    args = ("--engine", "sim", "--metrics-ports", str(free_block()))
    with sy_up(tmp, *args, env={"SY_TENANT_POLICY": str(policy)}) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def prometheus(fleet: UpFleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = fleet.data / "prometheus" / "prometheus.yml"
    assert f"scrape with: prometheus --config.file {config}" in fleet.output()
    port = free_port()
    log = tmp_path_factory.mktemp("prometheus-log") / "prometheus.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
             f"--storage.tsdb.path={config.parent / 'data'}"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        until_blocking(lambda: ready(url, proc, log), timeout=60, what="prometheus ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        pytest.fail(f"prometheus exited {proc.returncode}:\n{log.read_text()[-3000:]}")
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def query(url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"query": expr} if at is None else {"query": expr, "time": at}
    reply = httpx.get(f"{url}/api/v1/query", params=params, timeout=10)
    body = reply.json()
    assert body["status"] == "success", f"{expr}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def steps(edge: str, n: int, session: str) -> dict[str, Any]:
    """`n` chats and `n` agent steps of one episode, each answered; the last step."""
    chat = {"model": "default", "messages": [{"role": "user", "content": "Say hi"}],
            "max_tokens": 8}  # fmt: skip
    for i in range(n):
        assert httpx.post(f"{edge}/v1/chat/completions", headers=KEY, json=chat,
                          timeout=60).is_success  # fmt: skip
        step = {"session": session, "step": i, "frame_ts": time.time(), "goal": "open settings",
                "frames": [{"data": png((20, 90 + i, 160)), "mime": "image/png"}]}  # fmt: skip
        reply = httpx.post(f"{edge}/v1/agent/step", headers=KEY, json=step, timeout=60)
        assert reply.is_success, reply.text
    return step


def load(fleet: UpFleet) -> None:
    """Every workload once, and each refusal the dashboard counts."""
    edge = fleet.edge
    chat = {"model": "default", "messages": [{"role": "user", "content": "Say hi"}],
            "max_tokens": 8}  # fmt: skip
    greedy = {**chat, "max_tokens": OTPM + 1}
    refused = httpx.post(f"{edge}/v1/chat/completions", headers=KEY, json=greedy, timeout=60)
    assert refused.status_code == 400, refused.text
    # A stream the client walks away from: the edge cancels it.
    with httpx.stream("POST", f"{edge}/v1/chat/completions", headers=KEY, timeout=60,
                      json={**chat, "stream": True, "max_tokens": 200}) as stream:  # fmt: skip
        next(stream.iter_lines())
    step = steps(edge, 1, "prom-1")
    bad = {**step, "frame_ts": time.time(),
           "frames": [{"data": base64.b64encode(b"not an image").decode()}]}  # fmt: skip
    stale = {**step, "session": "prom-2", "frame_ts": time.time() - 60}
    for refused in (bad, stale):
        reply = httpx.post(f"{edge}/v1/agent/step", headers=KEY, json=refused, timeout=60)
        assert reply.status_code >= 400, reply.text
    env = fleet_env(fleet.data)
    url = fleet.output().split("embedded nats-server on ", 1)[1].split(",", 1)[0]
    for question in ("How many players registered yesterday?", "List the game servers"):
        done = run([str(SY), "sql", "ask", "--nats", url, "-t", "acme", "--json", question],
                   env, timeout=150)  # fmt: skip
        assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    asyncio.run(undecodable(url))


async def undecodable(url: str) -> None:
    """A message no service can decode: the preprocessor dead-letters it."""
    nc = await nats.connect(url)
    try:
        await nc.jetstream().publish("agent.in.dev", b"\xff not a step")
    finally:
        await nc.close()


def filled(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a dashboard variable this test does not fill: {expr}"
    return expr


def dashboard_exprs() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [
        (f"panel {p['id']} {p['title']!r}", filled(t["expr"]))
        for p in panels
        for t in p.get("targets", [])
    ]


# Read from a GPU (the workers' NVML, NVIDIA's DCGM exporter), which this machine lacks.
NEEDS_GPU = re.compile(r"\b(?:sy_gpu_|DCGM_)")
_THRESHOLD = re.compile(r"\s*(?:>|<|==|!=|>=|<=)\s*[0-9.e+-]+\s*$")
_JOIN = re.compile(r"\n\s*(?:and|or|unless)\s+")


def rule_exprs() -> list[tuple[str, str]]:
    """Each alert's operands (split at a top-level `and`/`or` that starts a line), each
    without its threshold."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    exprs = []
    for group in groups:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            for part in _JOIN.split(rule["expr"].strip()):
                exprs.append((f"rule {name}", _THRESHOLD.sub("", part.strip())))
    return exprs


def test_every_dashboard_panel_and_alert_reads_series(fleet: UpFleet, prometheus: str) -> None:
    targets = json.loads((fleet.data / "prometheus" / "targets.json").read_text())
    scraped = sum(len(group["targets"]) for group in targets)
    until_blocking(lambda: len([r for r in query(prometheus, "up == 1")]) == scraped,
                   timeout=60, what=f"all {scraped} targets up")  # fmt: skip
    load(fleet)
    # A counter or histogram series is born at its first event, and Prometheus reads no
    # increase into a series' first sample: a second round, a scrape later, is what the
    # rate panels show (a fleet in service has long had its first).
    time.sleep(SCRAPE_S + 1)
    steps(fleet.edge, 3, "prom-3")
    loaded = time.time()
    exprs = dashboard_exprs() + rule_exprs()
    assert len(exprs) > 50
    if "worker.gpu_metrics_off" in fleet.output():  # no NVML here: no GPU series can exist
        exprs = [(where, e) for where, e in exprs if not NEEDS_GPU.search(e)]
    empty = exprs
    deadline = time.monotonic() + SERIES_TIMEOUT
    while empty and time.monotonic() < deadline:
        empty = [(where, e) for where, e in empty if not query(prometheus, e)]
        time.sleep(2)
    assert not empty, "no series:\n" + "\n".join(f"{w}: {e}" for w, e in empty)
    # What each read just after the load (`pytest -s` shows it): its series, the first's value.
    for where, expr in exprs:
        result = query(prometheus, expr, at=loaded + SHOWN_AFTER) or query(prometheus, expr)
        print(
            f"{where}: {len(result)} series, e.g. {result[0]['metric']} = {result[0]['value'][1]}"
        )
