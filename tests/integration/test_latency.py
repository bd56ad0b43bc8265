"""A request's latency as its client felt it, through the real fleet (edge, preprocessor,
router, a `sim` worker, in process on real NATS): the end-to-end and phase histograms of
the worker and the edge are observed under the request's pool and workload, the ITL of a
streamed chat, and the worker logs one line per request with what ran and how, never
the prompt or the answer."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import structlog
from prometheus_client import REGISTRY

from switchyard.ids import new_id
from switchyard.messages.inference import PHASES
from tests.integration.test_agent_path import png_frame
from tests.support.edge import agent_fleet_with_edge, write_keys
from tests.support.poll import until

KEY, TENANT = "sk-latency", "latency"


@dataclass(frozen=True)
class Fleet:
    url: str
    pool: str


@pytest.fixture(scope="module")
async def fleet(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    pool = f"lt{new_id().lower()[-8:]}"
    keys = write_keys(tmp_path_factory.mktemp("latency") / "keys.yaml", {KEY: {"tenant": TENANT}})
    # Delayed (a tenth of the modelled GPU's time), so that tokens come apart in time.
    async with agent_fleet_with_edge(
        nats_url, pool, keys, engine="sim", preprocessor={"agent_layout": "single"}, edge={},
        worker={"sim_delay_scale": 0.1},
    ) as url:  # fmt: skip
        yield Fleet(url, pool)


def count(metric: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(f"{metric}_count", labels) or 0.0


def total(metric: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(f"{metric}_sum", labels) or 0.0


def snapshot(pool: str, workload: str) -> dict[str, float]:
    seen = {
        "e2e_ttft": count("sy_worker_e2e_time_to_first_token_seconds", pool=pool,
                          workload=workload),
        "e2e_duration": count("sy_worker_e2e_duration_seconds", pool=pool, workload=workload),
        "e2e_duration_sum": total("sy_worker_e2e_duration_seconds", pool=pool,
                                  workload=workload),
        "itl": count("sy_worker_inter_token_latency_seconds", pool=pool),
        "edge_ttft": count("sy_edge_time_to_first_token_seconds", pool=pool, workload=workload),
        "edge_duration": count("sy_edge_answer_duration_seconds", pool=pool, workload=workload),
        "phases_sum": sum(total("sy_worker_phase_seconds", pool=pool, phase=p) for p in PHASES),
    }  # fmt: skip
    for phase in PHASES:
        seen[phase] = count("sy_worker_phase_seconds", pool=pool, phase=phase)
    for phase in ("edge", "fleet"):
        seen[f"edge.{phase}"] = count("sy_edge_phase_seconds", pool=pool, phase=phase)
    return seen


def grown(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


def done_lines(logs: list[dict[str, Any]], pool: str) -> list[dict[str, Any]]:
    return [e for e in logs if e.get("event") == "worker.done" and e.get("pool") == pool]


async def test_a_streamed_chat_is_timed_end_to_end_per_phase_and_per_token(
    fleet: Fleet,
) -> None:
    secret = f"tell nobody about the {new_id()} marmot"
    body = {
        "model": "default", "stream": True, "max_tokens": 24, "temperature": 0.7, "top_p": 0.9,
        "messages": [{"role": "user", "content": secret}],
    }  # fmt: skip
    before = snapshot(fleet.pool, "llm")
    with structlog.testing.capture_logs() as logs:
        async with (
            httpx.AsyncClient(base_url=fleet.url, timeout=60) as c,
            c.stream("POST", "/v1/chat/completions", json=body,
                     headers={"Authorization": f"Bearer {KEY}"}) as resp,
        ):  # fmt: skip
            assert resp.status_code == 200
            events = [line async for line in resp.aiter_lines() if line.startswith("data: {")]
        # Logged once its answer is out: the client may have read it first.
        await until(lambda: bool(done_lines(logs, fleet.pool)), timeout=10, what="worker.done")
    chunks = [json.loads(e.removeprefix("data: ")) for e in events]
    answer = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert len(answer) > 0
    change = grown(before, snapshot(fleet.pool, "llm"))

    # Once each, under the chat's pool and workload, at the worker and at the edge.
    for name in ("e2e_ttft", "e2e_duration", "edge_ttft", "edge_duration", "edge.edge",
                 "edge.fleet"):  # fmt: skip
        assert change[name] == 1, (name, change)
    # Every phase of a chat the edge prepared, the sim reporting its engine queue.
    assert {p: change[p] for p in PHASES} == dict.fromkeys(PHASES, 1)
    # The phases split the end-to-end time of the answer, nothing more, nothing less.
    assert change["phases_sum"] == pytest.approx(change["e2e_duration_sum"], abs=1e-6)
    # A gap between each two outputs that carried tokens, several in 24 tokens.
    assert change["itl"] >= 2

    lines = done_lines(logs, fleet.pool)
    assert len(lines) == 1
    line = lines[0]
    assert line["status"] == "ok" and line["workload"] == "llm"
    assert line["model"] == "qwen3-vl-8b" and line["model_version"].startswith("sim-")
    assert (line["temperature"], line["top_p"], line["max_tokens"]) == (0.7, 0.9, 24)
    assert line["finish_reason"] in ("stop", "length")
    assert line["prompt_tokens"] > 0 and line["completion_tokens"] > 0
    assert set(line["phases"]) == set(PHASES)
    flat = json.dumps(line, default=str)
    assert "marmot" not in flat and answer not in flat  # never the prompt or the answer


async def test_an_agent_step_is_timed_under_the_agent_workload(fleet: Fleet) -> None:
    before = snapshot(fleet.pool, "agent")
    step = {
        "frames": [{"data": base64.b64encode(png_frame(1)).decode(), "mime": "image/png"}],
        "session": f"ep-{new_id()[-8:]}", "frame_ts": time.time(), "stale_after": 120.0,
        "goal": "collect the daily reward",
    }  # fmt: skip
    async with httpx.AsyncClient(base_url=fleet.url, timeout=60) as c:
        resp = await c.post("/v1/agent/step", json=step,
                            headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
    assert resp.status_code == 200, resp.text
    change = grown(before, snapshot(fleet.pool, "agent"))
    for name in ("e2e_ttft", "e2e_duration", "edge_ttft", "edge_duration"):
        assert change[name] == 1, (name, change)
    # Through the preprocessor: its phase is the step's INGRESS hop and frame preparation.
    assert change["preprocess"] == 1 and change["decode"] == 1
    assert change["phases_sum"] == pytest.approx(change["e2e_duration_sum"], abs=1e-6)
