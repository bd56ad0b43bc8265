"""Cancellation and idempotency through the edge, observed at the worker: a `sim` engine
slowed down (SY_SIM_DELAY_SCALE) so a long generation is still running when the client
goes away or retries, and the worker's results read back from the RES stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import yaml
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from nats.js.errors import KeyNotFoundError

from services.edge import lifecycle
from services.edge.idempotency import ORPHAN_AFTER, fingerprint, kv_key
from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.bus.topology import IDEMPOTENCY_BUCKET
from switchyard.codec import decode, encode
from switchyard.ids import new_id
from switchyard.messages.idempotency import Claim
from switchyard.messages.inference import ChatMessage, ChatRequest, GenerateResult
from switchyard.openai_compat import ChatCompletionRequest
from tests.support.edge import edge_in_process, write_keys
from tests.support.fleet import (
    chat_fleet_in_process,
    provision_pool,
    wait_for_pool,
)
from tests.support.poll import until

POOL = "edgesim"
# ~12 ms of modelled time per decode step: 2,000 tokens ~ 24 modelled s, ~7 s on the wall.
DELAY_SCALE = "0.3"
LONG = 2000
POLICY = {"default": {"itpm": 10_000_000, "otpm": 10_000_000, "max_queued_tokens": 50_000_000}}
KEYS = {"sk-cut": {"tenant": "cut"}, "sk-idem": {"tenant": "idem"}}
HELLO = [{"role": "user", "content": "Tell me a long story."}]


@pytest.fixture(scope="module")
async def edge(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    from switchyard.bus.connection import connect
    from switchyard.config import Settings

    tmp = tmp_path_factory.mktemp("edge-sim")
    policy = tmp / "tenants.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    keys = write_keys(tmp / "keys.yaml", KEYS)
    bus = await connect(Settings(nats_url=nats_url), "edge-sim-setup")
    await provision_pool(bus.js, POOL)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SY_SIM_DELAY_SCALE", DELAY_SCALE)
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(bus.close)
            await stack.enter_async_context(chat_fleet_in_process(nats_url, POOL, policy))
            url = await stack.enter_async_context(
                edge_in_process(nats_url, api_keys_file=keys, chat_pool=POOL)
            )
            await wait_for_pool(bus.js, POOL)
            yield url


@contextlib.asynccontextmanager
async def results(bus: Bus, tenant: str) -> AsyncIterator[list[GenerateResult]]:
    """Every result published on `res.llm.<tenant>` from now on (a JetStream subscription)."""
    seen: list[GenerateResult] = []

    async def on_msg(msg: Msg) -> None:
        seen.append(decode(msg.data, GenerateResult))

    sub = await bus.js.subscribe(
        subjects.res("llm", tenant), cb=on_msg, deliver_policy=DeliverPolicy.NEW
    )
    try:
        yield seen
    finally:
        await sub.unsubscribe()


async def claimed(bus: Bus, tenant: str, key: str) -> bool:
    """Whether a request of `tenant` holds the Idempotency-Key `key` (the edge's claim)."""
    kv = await bus.js.key_value(IDEMPOTENCY_BUCKET)
    try:
        await kv.get(kv_key(tenant, key))
    except KeyNotFoundError:
        return False
    return True


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_client_disconnect_mid_stream_cancels_the_generation(edge: str, bus: Bus) -> None:
    body = {"model": "default", "messages": HELLO, "max_tokens": LONG, "stream": True}
    async with results(bus, "cut") as seen:
        chunks: list[dict[str, object]] = []
        async with (
            httpx.AsyncClient(base_url=edge, timeout=30) as http,
            http.stream("POST", "/v1/chat/completions", json=body, headers=auth("sk-cut")) as r,
        ):
            assert r.status_code == 200
            rid = r.headers["x-request-id"]
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
                if len(chunks) >= 4:
                    break
            # Leaving both blocks drops the TCP connection with the body unread.
        closed = time.monotonic()
        await until(lambda: any(x.request_id == rid for x in seen), timeout=5,
                    what="the cancelled result")  # fmt: skip
        waited = time.monotonic() - closed
    (mine,) = [x for x in seen if x.request_id == rid]
    assert mine.status == "cancelled" and mine.finish_reason == "abort"
    assert mine.error is not None and mine.error.code == "cancelled"
    # The whole generation takes ~7 s; it stopped soon after the disconnect.
    assert 1 <= mine.usage.completion_tokens < LONG // 4, mine.usage
    assert waited < 3


async def test_idempotent_retry_of_a_running_request_attaches_to_it(edge: str, bus: Bus) -> None:
    # ~150 tokens: about half a second on the wall, so the retry lands mid-generation.
    body = {"model": "default", "messages": HELLO, "max_tokens": 150}
    headers = {**auth("sk-idem"), "Idempotency-Key": "attach-1"}
    async with results(bus, "idem") as seen, httpx.AsyncClient(base_url=edge, timeout=30) as http:
        first = asyncio.create_task(http.post("/v1/chat/completions", json=body, headers=headers))
        await until(lambda: claimed(bus, "idem", "attach-1"), timeout=30, what="the first claim")
        assert not first.done()
        retry = await http.post("/v1/chat/completions", json=body, headers=headers)
        original = await first
        await asyncio.sleep(0.5)  # a second generation, if any, would have published by now
    assert original.status_code == 200 and retry.status_code == 200, retry.text
    assert retry.headers.get("idempotent-replayed") == "true"
    assert "idempotent-replayed" not in original.headers
    one, two = original.json(), retry.json()
    assert one["id"] == two["id"]
    assert one["choices"][0]["message"]["content"] == two["choices"][0]["message"]["content"]
    assert one["usage"]["completion_tokens"] == 150
    # One generation: exactly one result for the tenant, and it is the original's.
    assert [(x.request_id, x.status) for x in seen] == [(original.headers["x-request-id"], "ok")]


async def test_idempotent_retry_of_a_running_stream_attaches_too(edge: str, bus: Bus) -> None:
    body = {"model": "default", "messages": HELLO, "max_tokens": 150, "stream": True}
    headers = {**auth("sk-idem"), "Idempotency-Key": "attach-stream-1"}

    async def text_of(http: httpx.AsyncClient) -> tuple[httpx.Response, str]:
        parts: list[str] = []
        async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        parts.append(choice["delta"].get("content") or "")
        return r, "".join(parts)

    async with results(bus, "idem") as seen, httpx.AsyncClient(base_url=edge, timeout=30) as http:
        first = asyncio.create_task(text_of(http))
        await until(lambda: claimed(bus, "idem", "attach-stream-1"), timeout=30,
                    what="the first claim")  # fmt: skip
        (r2, t2), (r1, t1) = await text_of(http), await first
        await asyncio.sleep(0.5)  # a second generation, if any, would have published by now
    assert r2.headers.get("idempotent-replayed") == "true"
    assert t1 and t1 == t2
    assert [x.request_id for x in seen] == [r1.headers["x-request-id"]]


async def orphan_claim(bus: Bus, key: str, body: dict[str, object]) -> str:
    """The claim an edge leaves when it dies right after claiming `key` for `body`: its
    request made `ORPHAN_AFTER` ago (so a live edge would have published or released it
    by now). Returns that request's id."""
    original = new_id(time.time() - ORPHAN_AFTER - 1.0)
    sent = ChatCompletionRequest.model_validate(body).model_dump_json().encode()
    claim = Claim(request_id=original, fingerprint=fingerprint(sent))
    kv = await bus.js.key_value(IDEMPOTENCY_BUCKET)
    await kv.create(kv_key("idem", key), encode(claim))
    return original


async def test_a_key_left_claimed_by_a_dead_edge_is_run_once_by_the_retry(
    edge: str, bus: Bus
) -> None:
    """The edge died between claiming the key and publishing: the retry runs the request
    under the claim's id (before: 409 "still running" until the key's TTL, a day)."""
    body = {"model": "default", "messages": HELLO, "max_tokens": 8}
    key = f"orphan-{new_id()}"
    headers = {**auth("sk-idem"), "Idempotency-Key": key}
    original = await orphan_claim(bus, key, body)
    async with results(bus, "idem") as seen, httpx.AsyncClient(base_url=edge, timeout=30) as http:
        retry = await http.post("/v1/chat/completions", json=body, headers=headers)
        await asyncio.sleep(0.5)  # a second generation, if any, would have published by now
        again = await http.post("/v1/chat/completions", json=body, headers=headers)
    assert retry.status_code == 200, retry.text
    assert retry.headers["x-request-id"] == original
    assert [(x.request_id, x.status) for x in seen] == [(original, "ok")]
    # Its result was stored under the key like any original's: the next retry replays it.
    assert again.status_code == 200 and again.headers.get("idempotent-replayed") == "true"
    assert again.json()["id"] == retry.json()["id"]
    changed = {**body, "max_tokens": 9}  # the key with another request is still refused
    assert (await httpx.AsyncClient(base_url=edge).post(
        "/v1/chat/completions", json=changed, headers=headers)).status_code == 422  # fmt: skip


async def test_a_retry_of_an_old_claim_whose_request_did_reach_the_fleet_runs_nothing_new(
    edge: str, bus: Bus
) -> None:
    """The same old claim, but the dead edge had published its request: the retry's copy
    is a duplicate INGRESS drops, and the retry answers with the original's one result."""
    body = {"model": "default", "messages": HELLO, "max_tokens": 8}
    key = f"orphan-{new_id()}"
    headers = {**auth("sk-idem"), "Idempotency-Key": key}
    async with results(bus, "idem") as seen, httpx.AsyncClient(base_url=edge, timeout=30) as http:
        original = await orphan_claim(bus, key, body)
        chat = ChatRequest(
            id=original, tenant="idem", reply=f"_INBOX.dead.{original}",
            messages=[ChatMessage(role="user", content=HELLO[0]["content"])],
        )  # fmt: skip
        await publish(bus.js, subjects.llm_in("idem"), chat)
        retry = await http.post("/v1/chat/completions", json=body, headers=headers)
        await asyncio.sleep(0.5)
    assert retry.status_code == 200, retry.text
    assert retry.headers["x-request-id"] == original
    assert retry.headers.get("idempotent-replayed") == "true"
    assert [x.request_id for x in seen] == [original]


async def test_a_chat_whose_record_is_not_stored_is_refused_and_not_run(
    edge: str, bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The edge publishes its chat on REQ (to run) and on INGRESS (the record) at once.
    When INGRESS cannot take the record (here: a stream provisioned before `llm.edge.>`
    existed), the client gets a typed 503 once the edge's patience is spent, and the chat
    REQ did take is cancelled, not run on for nobody."""
    monkeypatch.setattr(lifecycle, "INGRESS_PATIENCE", 0.5)
    config = (await bus.js.stream_info("INGRESS")).config
    subjects_before = list(config.subjects or [])
    config.subjects = [s for s in subjects_before if s != "llm.edge.>"]
    await bus.js.update_stream(config)
    try:
        body = {"model": "default", "messages": HELLO, "max_tokens": LONG}
        async with (
            results(bus, "cut") as seen,
            httpx.AsyncClient(base_url=edge, timeout=30) as http,
        ):
            r = await http.post("/v1/chat/completions", json=body, headers=auth("sk-cut"))
            assert r.status_code == 503, r.text
            error = r.json()["error"]
            assert error["code"] == "bus_unavailable" and r.headers["retry-after"] == "1"
            rid = r.headers["x-request-id"]
            await until(lambda: any(x.request_id == rid for x in seen), timeout=20,
                        what="the refused chat's result")  # fmt: skip
        (result,) = [x for x in seen if x.request_id == rid]
        assert result.status == "cancelled", result
        assert result.usage.completion_tokens < LONG  # stopped, not run to its end
    finally:
        config.subjects = subjects_before
        await bus.js.update_stream(config)
