"""`sy sim-server` backends as processes, and what the harness reads from them."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import httpx

from switchyard.bench.peers.stats import Sample, parse_metrics
from switchyard.fleet import ProcessGroup
from switchyard.ports import free_port

MODEL = "sim"


def start_sim_servers(group: ProcessGroup, n: int, *, delay_scale: float) -> list[str]:
    """Start `n` sim servers (same settings, same seed); their base URLs, once all answer."""
    started = []
    for i in range(n):
        port = free_port()
        argv = [
            sys.executable, "-m", "switchyard.cli.app", "sim-server", "--port", str(port),
            "--delay-scale", str(delay_scale), "--model", MODEL,
        ]  # fmt: skip
        started.append((group.start(f"sim-{i}", argv), f"http://127.0.0.1:{port}"))
    for child, url in started:
        group.wait_http(child, f"{url}/health", timeout=90)
    return [url for _, url in started]


async def scrape(http: httpx.AsyncClient, urls: list[str]) -> list[Sample]:
    async def one(url: str) -> Sample:
        r = await http.get(f"{url}/metrics")
        r.raise_for_status()
        return parse_metrics(r.text)

    return list(await asyncio.gather(*(one(u) for u in urls)))


async def reset(http: httpx.AsyncClient, urls: list[str]) -> None:
    """Cold engines on every backend, so each policy starts from the same state."""
    for r in await asyncio.gather(*(http.post(f"{u}/sim/reset") for u in urls)):
        r.raise_for_status()


async def timings(
    http: httpx.AsyncClient, urls: list[str]
) -> dict[str, tuple[int, dict[str, Any]]]:
    """Modelled timings of every request since the last reset: request id -> (backend, timings)."""
    out: dict[str, tuple[int, dict[str, Any]]] = {}
    for i, url in enumerate(urls):
        r = await http.get(f"{url}/sim/timings")
        r.raise_for_status()
        for t in r.json():
            out[t["request_id"]] = (i, t)
    return out
