"""Two edge processes serving the same tenants (issue #24): a client alternating between
them is served by both, an Idempotency-Key claimed at one edge is honoured at the other
(a retry attaches to the running request, no second generation), and a client leaving
either edge cancels its generation on the fleet. Results are read back from RES."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import yaml

from switchyard.bus.connection import Bus, connect
from switchyard.config import Settings
from switchyard.fleet.readiness import wait_http
from switchyard.ports import free_port
from tests.support.edge import write_keys
from tests.support.fleet import (
    chat_fleet_in_process,
    provision_pool,
    service_process,
    stored_results,
    wait_for_pool,
)
from tests.support.poll import until

POOL = "twoedges"
POLICY = {"default": {"itpm": 10_000_000, "otpm": 10_000_000, "max_queued_tokens": 50_000_000}}
KEYS = {"sk-two": {"tenant": "two"}}
AUTH = {"Authorization": "Bearer sk-two"}
HELLO = [{"role": "user", "content": "Tell me a long story."}]


@pytest.fixture(scope="module")
async def edges(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[
    tuple[str, str]
]:  # fmt: skip
    """(edge A's URL, edge B's URL): two edge processes over one fleet (router, a `sim`
    worker slowed down so a long answer is still running when a client acts, chat)."""
    tmp = tmp_path_factory.mktemp("two-edges")
    policy = tmp / "tenants.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    keys = write_keys(tmp / "keys.yaml", KEYS)
    bus = await connect(Settings(nats_url=nats_url), "two-edges-setup")
    await provision_pool(bus.js, POOL)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SY_SIM_DELAY_SCALE", "0.3")
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(bus.close)
            await stack.enter_async_context(chat_fleet_in_process(nats_url, POOL, policy))
            urls = []
            for _ in range(2):
                port = free_port()
                stack.enter_context(_edge(nats_url, port, str(keys)))
                urls.append(f"http://127.0.0.1:{port}")
            await wait_for_pool(bus.js, POOL)
            for url in urls:
                await asyncio.to_thread(wait_http, f"{url}/readyz", timeout=60)
            yield urls[0], urls[1]


@contextlib.contextmanager
def _edge(nats_url: str, port: int, keys: str) -> Iterator[None]:
    env = {"SY_PORT": str(port), "SY_API_KEYS_FILE": keys, "SY_CHAT_POOL": POOL}
    with service_process("edge", nats_url, **env):
        yield


def chat(max_tokens: int, *, stream: bool = False) -> dict[str, object]:
    return {"model": "default", "messages": HELLO, "max_tokens": max_tokens, "stream": stream}


async def test_a_client_alternating_between_the_edges_is_served_by_both(
    edges: tuple[str, str], bus: Bus
) -> None:
    ids: list[str] = []
    async with httpx.AsyncClient(timeout=30) as http:
        for i in range(10):
            r = await http.post(f"{edges[i % 2]}/v1/chat/completions", json=chat(4),
                                headers=AUTH)  # fmt: skip
            assert r.status_code == 200, r.text
            ids.append(r.headers["x-request-id"])
    results = await stored_results(bus, "llm", "two", set(ids), timeout=30)
    mine = [r for r, _ in results if r.request_id in set(ids)]
    assert sorted(r.request_id for r in mine) == sorted(ids)
    assert all(r.status == "ok" for r in mine)


async def test_a_retry_at_the_other_edge_attaches_to_the_running_request(
    edges: tuple[str, str], bus: Bus
) -> None:
    a, b = edges
    headers = {**AUTH, "Idempotency-Key": "across-edges-1"}
    async with httpx.AsyncClient(timeout=30) as http:
        first = asyncio.create_task(
            http.post(f"{a}/v1/chat/completions", json=chat(150), headers=headers)
        )
        await asyncio.sleep(0.3)  # the claim is made before the request is published
        retry = await http.post(f"{b}/v1/chat/completions", json=chat(150), headers=headers)
        original = await first
        again = await http.post(f"{b}/v1/chat/completions", json=chat(150), headers=headers)
    assert original.status_code == retry.status_code == again.status_code == 200, retry.text
    rid = original.headers["x-request-id"]
    assert retry.headers["x-request-id"] == again.headers["x-request-id"] == rid
    assert retry.headers.get("idempotent-replayed") == "true"
    assert again.headers.get("idempotent-replayed") == "true"
    assert retry.json()["choices"] == original.json()["choices"] == again.json()["choices"]
    await asyncio.sleep(0.5)  # a second generation, if any, would have published by now
    results = await stored_results(bus, "llm", "two", {rid}, timeout=10)
    generated = [r for r, _ in results if r.request_id == rid]
    assert [r.status for r in generated] == ["ok"]


@pytest.mark.parametrize("which", [0, 1])
async def test_leaving_either_edge_cancels_the_generation(
    edges: tuple[str, str], bus: Bus, which: int
) -> None:
    url = edges[which]
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream("POST", f"{url}/v1/chat/completions", json=chat(2000, stream=True),
                    headers=AUTH) as r,
    ):  # fmt: skip
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        chunks = 0
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunks += 1
            if chunks >= 4:
                break
    closed = time.monotonic()

    async def cancelled() -> bool:
        results = await stored_results(bus, "llm", "two", {rid}, timeout=0)
        return any(x.request_id == rid and x.status == "cancelled" for x, _ in results)

    await until(cancelled, timeout=10, what="the cancelled result")
    assert time.monotonic() - closed < 5
    results = await stored_results(bus, "llm", "two", {rid}, timeout=0)
    (mine,) = [x for x, _ in results if x.request_id == rid]
    assert mine.usage.completion_tokens < 500, json.dumps(mine.usage.model_dump())
