"""Cost per tenant: the worker's usage counters through a real fleet (a sim worker on
real NATS), and `sy usage` reading them back from a real Prometheus scraping it."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, start_http_server
from typer.testing import CliRunner

from services.worker import metrics as worker_metrics
from switchyard.bus.connection import Bus
from switchyard.cli import console
from switchyard.cli.app import app
from switchyard.messages.inference import ChatMessage, GenerateRequest, GenerateResult, Sampling
from switchyard.metrics import TenantLabel
from switchyard.ports import free_port
from tests.support.fleet import ask, provision_pool, worker_in_process
from tests.support.poll import until

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def fresh_tenant_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's top-20 tenant labels start empty: in one pytest process the in-process
    workers of earlier tests have labelled 20 tenants already, and this test's own would
    then count as `other`, as a real worker's 21st tenant does."""
    fresh = TenantLabel(
        20,
        watched=[
            worker_metrics.TOKENS_IN,
            worker_metrics.TOKENS_OUT,
            worker_metrics.ENGINE_REQUESTS,
            worker_metrics.GPU_SECONDS,
        ],
    )
    monkeypatch.setattr(worker_metrics, "TENANTS", fresh)


def chat(pool: str, tenant: str, text: str, max_tokens: int = 12) -> GenerateRequest:
    return GenerateRequest(
        tenant=tenant, workload="llm", pool=pool, sampling=Sampling(max_tokens=max_tokens),
        messages=[ChatMessage(role="user", content=text)],
    )  # fmt: skip


async def run_all(bus: Bus, reqs: list[GenerateRequest]) -> list[GenerateResult]:
    """Send `reqs` at once (the sim batches them) and return their results."""
    streams = await asyncio.gather(*(ask(bus, r) for r in reqs))
    results = [s[-1].result for s in streams]
    assert all(r is not None and r.status == "ok" for r in results), results
    return [r for r in results if r is not None]


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def usage_of(tenant: str, pool: str) -> dict[str, float]:
    gpu = "sy_worker_gpu_seconds_total"
    return {
        "requests": counter("sy_worker_engine_requests_total", tenant=tenant, pool=pool),
        "prompt_tokens": counter("sy_worker_prompt_tokens_total", tenant=tenant, pool=pool),
        "completion_tokens": counter("sy_worker_completion_tokens_total", tenant=tenant, pool=pool),
        "gpu_prefill_seconds": counter(gpu, tenant=tenant, pool=pool, phase="prefill"),
        "gpu_decode_seconds": counter(gpu, tenant=tenant, pool=pool, phase="decode"),
    }


@pytest.fixture
async def pool(bus: Bus, unique: str) -> str:
    name = f"u{unique}"
    await provision_pool(bus.js, name)
    return name


async def test_usage_is_counted_per_tenant_and_pool_and_batches_are_not_billed_twice(
    bus: Bus, pool: str, nats_url: str, unique: str, capfd: pytest.CaptureFixture[str]
) -> None:
    a, b = f"a{unique}", f"b{unique}"
    async with worker_in_process(nats_url, pool=pool, engine="sim"):
        began = time.monotonic()
        results = await run_all(
            bus, [chat(pool, a, f"question {i} " * 20) for i in range(3)] + [chat(pool, b, "hi")]
        )
        elapsed = time.monotonic() - began
    got_a, got_b = usage_of(a, pool), usage_of(b, pool)
    assert got_a["requests"] == 3 and got_b["requests"] == 1
    assert got_a["prompt_tokens"] == sum(r.usage.prompt_tokens for r in results[:3])
    assert got_a["completion_tokens"] == sum(r.usage.completion_tokens for r in results[:3])
    assert got_b["prompt_tokens"] == results[3].usage.prompt_tokens
    for got in (got_a, got_b):
        assert got["gpu_prefill_seconds"] > 0 and got["gpu_decode_seconds"] > 0
    # The four ran batched: each one's wall time on the engine counts the shared seconds
    # once per request, their GPU-seconds once in all.
    charged = sum(g["gpu_prefill_seconds"] + g["gpu_decode_seconds"] for g in (got_a, got_b))
    held = sum(r.timings.total - r.timings.queue for r in results)
    assert charged <= elapsed and charged < held / 1.5, (charged, held, elapsed)
    # No NVML on this machine: the worker ran on without GPU metrics, and said so once.
    assert not [f.name for f in REGISTRY.collect() if f.name.startswith("sy_gpu_") and f.samples]
    out, err = capfd.readouterr()
    assert (out + err).count("worker.gpu_metrics_off") == 1


# -- `sy usage` against a real Prometheus ---------------------------------------------


def prom_get(url: str, path: str, **params: str) -> Any:
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}{path}?{query}", timeout=5) as response:
        return json.load(response)


def sample_times(url: str, selector: str) -> list[tuple[float, float]]:
    """The (time, value) samples Prometheus holds of one series over the last minute."""
    result = prom_get(url, "/api/v1/query", query=f"{selector}[1m]")["data"]["result"]
    return [(float(t), float(v)) for t, v in result[0]["values"]] if result else []


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """Debian's Prometheus scraping this process's /metrics (the worker's registry) each
    second; yields its URL and the scraped port."""
    if shutil.which("prometheus") is None:
        pytest.skip("no prometheus binary (deploy/local/ensure-promtool.sh installs it)")
    metrics_port, web_port = free_port(), free_port()
    server, thread = start_http_server(metrics_port, addr="127.0.0.1")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: worker, static_configs: "
        f"[{{targets: ['127.0.0.1:{metrics_port}']}}]}}]\n"
    )
    url = f"http://127.0.0.1:{web_port}"
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{web_port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"),
    )  # fmt: skip
    try:
        yield url, metrics_port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        server.shutdown()
        thread.join(timeout=5)


def iso(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat()


async def test_sy_usage_reports_what_prometheus_scraped_per_tenant_and_pool(
    bus: Bus,
    pool: str,
    nats_url: str,
    unique: str,
    prometheus: tuple[str, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, _ = prometheus
    a, b = f"a{unique}", f"b{unique}"
    requests_a = f'sy_worker_engine_requests_total{{tenant="{a}", pool="{pool}"}}'
    requests_b = f'sy_worker_engine_requests_total{{tenant="{b}", pool="{pool}"}}'

    async def scraped(selector: str, value: float, times: int = 1) -> float:
        """Until Prometheus has `times` samples of `value` for `selector`; the last's time."""
        found: list[float] = []

        def seen() -> bool:
            found[:] = [t for t, v in sample_times(url, selector) if v == value]
            return len(found) >= times

        await until(lambda: asyncio.to_thread(seen), timeout=60, what=f"{selector} = {value}",
                    every=0.3)  # fmt: skip
        return found[-1]

    async with worker_in_process(nats_url, pool=pool, engine="sim"):
        await run_all(bus, [chat(pool, a, "warm up " * 10) for _ in range(2)])
        # Two samples of it before the range: the series existed when the range began.
        since = await scraped(requests_a, 2, times=2) - 0.001
        before = usage_of(a, pool)
        results = await run_all(
            bus, [chat(pool, a, f"q {i} " * 30) for i in range(3)] + [chat(pool, b, "hello")]
        )
        after_a, after_b = usage_of(a, pool), usage_of(b, pool)
        until_ = max(await scraped(requests_a, 5), await scraped(requests_b, 1))

    runner = CliRunner()
    args = ["usage", "--prometheus", url, "--since", iso(since), "--until", iso(until_)]
    done = runner.invoke(app, [*args, "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    rows = {(r["tenant"], r["pool"]): r for r in report["usage"]}
    # b was born within the range: its whole count, exactly. a existed before: its
    # increase, which Prometheus extrapolates over the 1 ms between `since` and its sample.
    row_b = rows[(b, pool)]
    assert {k: row_b[k] for k in after_b} == after_b
    assert row_b["prompt_tokens"] == results[3].usage.prompt_tokens
    row_a = rows[(a, pool)]
    for key, value in after_a.items():
        assert row_a[key] == pytest.approx(value - before[key], rel=0.01), key
    assert row_a["requests"] == pytest.approx(3, rel=0.01)

    monkeypatch.setattr(console, "width", 160)  # a terminal wide enough for whole names
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert a in table.stdout and b in table.stdout and "GPU-s prefill" in table.stdout
