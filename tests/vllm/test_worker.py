"""A worker process with `--engine vllm` (real vLLM on the CPU) on real NATS: what a GPU
worker does in production, through the same code path."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from switchyard import subjects
from switchyard.agentactions import parse_answer_text
from switchyard.bus.connection import Bus, connect
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.codec import encode
from switchyard.config import Settings
from switchyard.fleet.processes import Child
from switchyard.fleet.readiness import PoolReady, wait_for_pools
from switchyard.messages.inference import (
    ActionsConstraint,
    Cancel,
    ChatMessage,
    GenerateRequest,
    JsonSchemaConstraint,
    Sampling,
    TokenFrame,
)
from tests.support.fleet import ask, provision_pool, work_subject, worker_process
from tests.vllm.test_engine import LONG_SYSTEM

PARTITIONS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Worker:
    def __init__(self, child: Child, pool: str, metrics_port: int) -> None:
        self.child, self.pool, self.metrics_port = child, pool, metrics_port

    def metrics(self) -> dict[str, float]:
        """Its /metrics, summed by metric name (labels dropped)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+|NaN)$", line)
            if m and m.group(3) != "NaN":
                values[m.group(1)] = values.get(m.group(1), 0.0) + float(m.group(3))
        return values


@pytest.fixture(scope="module")
async def worker(nats_url: str, vllm_worker_env: dict[str, str]) -> AsyncIterator[Worker]:
    """One vLLM worker for the module, owning every partition of a private pool."""
    pool = f"v{uuid.uuid4().hex[:10]}"
    own = await connect(Settings(nats_url=nats_url), "vllm-tier")
    try:
        await provision_pool(own.js, pool, PARTITIONS)
        port = free_port()
        env = {
            **vllm_worker_env,
            "SY_POOL": pool,
            "SY_WORKER_ID": f"{pool}-w0",
            "SY_ASSIGNMENT": "static",
            "SY_PARTITIONS": str(PARTITIONS),
            "SY_HEARTBEAT_INTERVAL": "0.5",
            "SY_METRICS_PORT": str(port),
            "SY_DRAIN_TIMEOUT": "60",
        }
        since = time.time()
        with worker_process(nats_url, **env) as child:
            ready = PoolReady(pool, 1, PARTITIONS, routed=False, worker_ids=(f"{pool}-w0",))
            await wait_for_pools(own.js, [ready], since=since, timeout=180,
                                 check=child_alive(child))  # fmt: skip
            yield Worker(child, pool, port)
    finally:
        await own.close()


def child_alive(child: Child) -> Callable[[], None]:
    def check() -> None:
        if not child.alive():
            raise child.failure("the vLLM worker exited before it was ready")

    return check


def chat(pool: str, text: str, *, max_tokens: int = 16, **kw: object) -> GenerateRequest:
    return GenerateRequest(
        tenant="acme",
        workload="llm",
        pool=pool,
        messages=[ChatMessage(role="user", content=text)],
        sampling=Sampling(max_tokens=max_tokens, temperature=0.0),
        **kw,  # type: ignore[arg-type]
    )


def final(frames: list[TokenFrame]) -> TokenFrame:
    assert frames and frames[-1].type in ("end", "error"), frames[-1:]
    return frames[-1]


async def test_a_chat_streams_deltas_and_ends_with_usage(worker: Worker, bus: Bus) -> None:
    frames = await ask(bus, chat(worker.pool, "Count from one to ten.", max_tokens=12))
    deltas, end = frames[:-1], final(frames)
    assert [f.seq for f in frames] == list(range(len(frames)))
    assert len(deltas) >= 2 and end.result is not None and end.result.status == "ok"
    assert end.result.text == "".join(d.text for d in deltas)
    assert end.result.usage.completion_tokens == 12 and end.result.usage.prompt_tokens > 10
    assert end.result.worker == f"{worker.pool}-w0"
    assert end.result.timings.ttft is not None


async def test_a_json_schema_answer_through_the_worker(worker: Worker, bus: Bus) -> None:
    schema = {
        "type": "object",
        "properties": {"gold": {"type": "integer", "minimum": 0, "maximum": 9999}},
        "required": ["gold"],
    }
    req = chat(worker.pool, "How much gold? JSON.", max_tokens=30,
               constraint=JsonSchemaConstraint(json_schema=schema))  # fmt: skip
    end = final(await ask(bus, req))
    assert end.result is not None and end.result.status == "ok"
    assert 0 <= json.loads(end.result.text)["gold"] <= 9999


async def test_an_agent_step_is_one_whole_compact_action(worker: Worker, bus: Bus) -> None:
    req = chat(worker.pool, "A close button is at the top right. Act.", max_tokens=24,
               constraint=ActionsConstraint(action_format="compact"))  # fmt: skip
    end = final(await ask(bus, req))
    assert end.result is not None and end.result.status == "ok", end
    answer = parse_answer_text(end.result.text, "compact", chunk=1, thought=False)
    assert len(answer.actions) == 1


async def test_cancel_from_nats_stops_the_generation(worker: Worker, bus: Bus) -> None:
    req = chat(worker.pool, "Write a very long story about a dragon.", max_tokens=1000)
    async with TokenStreamReader(bus.nc, idle_timeout=60) as reader:
        await publish(bus.js, work_subject(req), req.model_copy(update={"reply": reader.inbox}))
        frames: list[TokenFrame] = []
        cancelled_at = 0.0
        async for frame in reader:
            frames.append(frame)
            if len(frames) == 3:
                cancelled_at = time.monotonic()
                cancel = Cancel(tenant="acme", request_id=req.id)
                await bus.nc.publish(subjects.cancel(req.id), encode(cancel))
        stopped_after = time.monotonic() - cancelled_at
    end = final(frames)
    assert end.result is not None and end.result.status == "cancelled"
    assert end.result.usage.completion_tokens < 1000
    assert stopped_after < 2.0


async def test_a_deadline_stops_the_generation_as_expired(worker: Worker, bus: Bus) -> None:
    req = chat(worker.pool, "Write a very long story about a castle.", max_tokens=1000,
               deadline=time.time() + 1.5)  # fmt: skip
    started = time.monotonic()
    end = final(await ask(bus, req))
    assert end.result is not None and end.result.status == "expired", end
    assert end.result.usage.completion_tokens < 1000
    assert time.monotonic() - started < 6.0


async def test_prefix_cache_hits_show_in_the_workers_metrics(worker: Worker, bus: Bus) -> None:
    before = worker.metrics()
    for i in range(2):
        req = chat(worker.pool, "Hello?", max_tokens=2, session=f"prefix-{i}")
        req = req.model_copy(
            update={"messages": [ChatMessage(role="system", content=LONG_SYSTEM), *req.messages]}
        )
        end = final(await ask(bus, req))
        assert end.result is not None and end.result.status == "ok"
    assert end.result.usage.cached_tokens >= 128
    # vLLM's stat logger updates its counters once per engine step: give it a moment.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = worker.metrics()
        hits = after.get("vllm:prefix_cache_hits_total", 0) - before.get(
            "vllm:prefix_cache_hits_total", 0
        )
        if hits >= 128:
            break
        await asyncio.sleep(0.5)
    assert hits >= 128, "the worker's /metrics count vLLM's prefix-cache hits"
    for name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:num_preemptions_total",
                 "sy_worker_partitions"):  # fmt: skip
        assert name in after, f"{name} missing from the vLLM worker's /metrics"


def test_without_nvml_the_gpu_metrics_are_absent_and_said_once(worker: Worker) -> None:
    """A CPU machine has no NVML: no `sy_gpu_*` series, one log line, and a worker whose
    probes pass once its engine answered the warm-up (#40)."""
    assert not [name for name in worker.metrics() if name.startswith("sy_gpu_")]
    assert worker.child.output().count("worker.gpu_metrics_off") == 1
    for probe in ("startupz", "readyz", "healthz"):
        url = f"http://127.0.0.1:{worker.metrics_port}/{probe}"
        with urllib.request.urlopen(url, timeout=5) as r:
            assert r.status == 200, probe


async def test_sigterm_drains_what_runs_then_exits_zero(worker: Worker, bus: Bus) -> None:
    """Last in this module: it stops the module's worker."""
    req = chat(worker.pool, "Write a long story about a knight.", max_tokens=120)
    async with TokenStreamReader(bus.nc, idle_timeout=60) as reader:
        await publish(bus.js, work_subject(req), req.model_copy(update={"reply": reader.inbox}))
        frames: list[TokenFrame] = []
        async for frame in reader:
            frames.append(frame)
            if len(frames) == 2:
                worker.child.proc.send_signal(signal.SIGTERM)
    end = final(frames)
    assert end.result is not None and end.result.status == "ok"
    assert end.result.usage.completion_tokens == 120, "the drain let it finish"
    code = await asyncio.to_thread(worker.child.proc.wait, 60)
    assert code == 0, worker.child.tail()
