"""The console's API on a real fleet (router publishing tenant status, a `sim` worker, the
edge in process): `GET /v1/fleet` auth and tenant isolation, `POST /v1/sql/review`,
and the static pages with their security headers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import nats.js.errors
import pytest
import yaml

from services.router.service import run_router
from services.router.settings import RouterSettings
from services.router.status import publish_status
from switchyard import subjects
from switchyard.bus.connection import Bus, connect
from switchyard.bus.publish import publish
from switchyard.bus.topology import TENANTS_BUCKET
from switchyard.codec import decode, encode
from switchyard.config import Settings
from switchyard.messages.fleet import TenantStatus, tenant_status_key
from switchyard.messages.inference import Cancel, ChatMessage, GenerateRequest, Sampling
from switchyard.messages.sql import AuditEvent
from switchyard.text2sql.review import review_requests
from tests.support.edge import edge_in_process, write_keys
from tests.support.fleet import (
    provision_pool,
    router_in_process,
    submit,
    wait_for_pool,
    worker_in_process,
)
from tests.support.poll import until

KEYS: dict[str, dict[str, Any]] = {
    "sk-acme": {"tenant": "acme"},
    "sk-nova": {"tenant": "nova"},
    "sk-ops": {"tenant": "ops", "operator": True},
    "sk-chat-only": {"tenant": "acme", "pools": ["llm"]},
}
# Small input quotas so the tokens a request spent are still visible for a while
# (a bucket refills at itpm/60 tokens per second: 100/s here).
POLICY = {
    "default": {"itpm": 6000, "otpm": 30_000},
    "tenants": {"acme": {"itpm": 6000, "otpm": 30_000, "max_concurrency": 7}},
}
PROMPT_TOKENS = {"acme": 5000, "nova": 2500}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def left_the_stream(bus: Bus, stream: str, seq: int) -> bool:
    """Whether message `seq` is gone from work-queue `stream`: its consumer acked it."""
    try:
        await bus.js.get_msg(stream, seq)
    except nats.js.errors.NotFoundError:
        return True
    return False


async def published_since(bus: Bus, router_id: str, since: float) -> bool:
    """Whether the router has published every tenant's status at or after `since`."""
    kv = await bus.js.key_value(TENANTS_BUCKET)
    for tenant in PROMPT_TOKENS:
        try:
            entry = await kv.get(tenant_status_key(tenant, router_id))
        except nats.js.errors.KeyNotFoundError:
            return False
        if not entry.value or decode(entry.value, TenantStatus).at < since:
            return False
    return True


async def test_the_router_service_publishes_each_tenants_status(
    nats_url: str, bus: Bus, tmp_path: Path, unique: str
) -> None:
    """`run_router` (what `python -m services.router` runs) keeps KV `fleet_tenants`
    current: a request queued with no worker shows as queued, waiting longer and longer.

    First in the module on purpose: no other router shares the REQ consumer yet."""
    pool, router_id = f"s{unique}", f"svc{unique}"
    await provision_pool(bus.js, pool)
    policy = tmp_path / "tenants.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    settings = RouterSettings(nats_url=nats_url, router_id=router_id, pools=[pool],
                              partitions=4, tenant_policy=policy)  # fmt: skip
    router_bus = await connect(settings, "test-router-service")
    stop = asyncio.Event()
    task = asyncio.create_task(run_router(router_bus, stop, settings))
    request = GenerateRequest(
        tenant="acme", workload="llm", pool=pool, prompt_tokens=1200,
        messages=[ChatMessage(role="user", content="hello")], sampling=Sampling(max_tokens=8),
    )  # fmt: skip
    kv = await bus.js.key_value(TENANTS_BUCKET)
    seen: list[TenantStatus] = []

    async def waited_over_a_second() -> bool:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            entry = await kv.get(tenant_status_key("acme", router_id))
            assert entry.value is not None
            seen.append(decode(entry.value, TenantStatus))
        return bool(seen) and seen[-1].oldest_wait > 1.0

    stored = None
    try:
        stored = await publish(bus.js, subjects.req("llm", "acme"), request)
        await until(waited_over_a_second, timeout=30, every=0.2, what="a status of a 1 s wait")
    finally:
        # Let the router answer it (cancelled) and ack it, so no later router gets it.
        cancel = Cancel(tenant="acme", request_id=request.id, reason="test over")
        await bus.nc.publish(subjects.cancel(request.id), encode(cancel))
        await bus.nc.flush()
        if stored is not None:
            seq = stored.seq
            await until(lambda: left_the_stream(bus, "REQ", seq), timeout=30,
                        what="the cancelled request acked")  # fmt: skip
        stop.set()
        await asyncio.wait_for(task, 30)
        await router_bus.close()
    assert seen, "no status in KV fleet_tenants"
    last = seen[-1]
    assert last.tenant == "acme" and last.router == router_id, last
    assert last.queued == 1 and last.queued_tokens == 1208 and last.inflight == 1
    # 1200 tokens taken, refilling at 100/s for the few seconds it waited.
    assert last.oldest_wait > 1.0 and 600 < last.input_used <= 1200
    assert last.at > seen[0].at  # rewritten, not written once


@pytest.fixture(scope="module")
async def console(
    nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[str, str, str]]:
    """(edge URL, pool, router id) of a fleet where acme and nova have each run one request."""
    unique = uuid.uuid4().hex[:10]
    pool, router_id = f"c{unique}", f"rt{unique}"
    tmp = tmp_path_factory.mktemp("console-api")
    bus = await connect(Settings(nats_url=nats_url), "console-api-test")
    await provision_pool(bus.js, pool)
    policy = tmp / "tenants.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    keys = write_keys(tmp / "keys.yaml", KEYS)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(bus.close)
        router = await stack.enter_async_context(
            router_in_process(nats_url, partitions=4, pools=[pool], tenant_policy=policy,
                              router_id=router_id, rebalance_interval=0.2)
        )  # fmt: skip
        stop = asyncio.Event()
        status = asyncio.create_task(publish_status(router, stop, interval=0.2))
        stack.callback(stop.set)
        await stack.enter_async_context(
            worker_in_process(nats_url, pool=pool, engine="sim", assignment="kv",
                              worker_id=f"{pool}-w0", heartbeat_interval=0.3)
        )  # fmt: skip
        url = await stack.enter_async_context(
            edge_in_process(nats_url, api_keys_file=keys, chat_pool=pool)
        )
        await wait_for_pool(bus.js, pool)
        for tenant, tokens in PROMPT_TOKENS.items():
            request = GenerateRequest(
                tenant=tenant, workload="llm", pool=pool, prompt_tokens=tokens,
                messages=[ChatMessage(role="user", content="hello")],
                sampling=Sampling(max_tokens=8),
            )  # fmt: skip
            frames = await submit(bus, request, timeout=30)
            assert frames[-1].type == "end", frames[-1]
        await until(lambda: not router.ledger.outstanding, timeout=30, what="both results routed")
        settled = time.time()
        await until(lambda: published_since(bus, router_id, settled), timeout=30,
                    what="a status publication after both finished")  # fmt: skip
        yield url, pool, router_id
        stop.set()
        await asyncio.wait_for(status, 10)


async def test_fleet_needs_a_valid_key(console: tuple[str, str, str]) -> None:
    url, _, _ = console
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        assert (await http.get("/v1/fleet")).status_code == 401
        r = await http.get("/v1/fleet", headers=auth("sk-nobody"))
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


async def test_tenant_key_sees_the_workers_and_only_its_own_usage(
    console: tuple[str, str, str],
) -> None:
    url, pool, router_id = console
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        acme = await http.get("/v1/fleet", headers=auth("sk-acme"))
        nova = await http.get("/v1/fleet", headers=auth("sk-nova"))
    assert acme.status_code == 200 and nova.status_code == 200, acme.text
    body = acme.json()
    assert body["tenant"] == "acme" and body["operator"] is False
    (worker,) = [w for w in body["workers"] if w["pool"] == pool]
    assert worker["worker"] == f"{pool}-w0" and worker["partitions"] == [0, 1, 2, 3]
    assert worker["age"] < 5 and worker["slots"] >= 1
    # Only acme's rows, and not a byte about nova anywhere in the response.
    assert {t["tenant"] for t in body["tenants"]} == {"acme"}
    assert "nova" not in acme.text
    (mine,) = [t for t in body["tenants"] if t["router"] == router_id]
    assert mine["itpm"] == 6000 and mine["max_concurrency"] == 7
    # 5000 tokens spent, refilling at 100/s: they show as used for tens of seconds.
    assert 2500 < mine["input_used"] <= 5000, mine
    assert mine["inflight"] == 0 and mine["queued"] == 0 and mine["oldest_wait"] == 0
    other = nova.json()
    assert {t["tenant"] for t in other["tenants"]} == {"nova"} and "acme" not in nova.text
    (theirs,) = [t for t in other["tenants"] if t["router"] == router_id]
    assert 0 < theirs["input_used"] <= 2500 < mine["input_used"]


async def test_operator_key_sees_every_tenant(console: tuple[str, str, str]) -> None:
    url, _, router_id = console
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.get("/v1/fleet", headers=auth("sk-ops"))
    assert r.status_code == 200
    body = r.json()
    assert body["operator"] is True
    here = {t["tenant"] for t in body["tenants"] if t["router"] == router_id}
    assert here == {"acme", "nova"}


async def test_a_key_sees_only_the_workers_of_its_pools(console: tuple[str, str, str]) -> None:
    url, pool, _ = console
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.get("/v1/fleet", headers=auth("sk-chat-only"))
    assert r.status_code == 200
    assert all(w["pool"] == "llm" for w in r.json()["workers"])
    assert pool not in r.text


async def test_a_stray_row_of_another_tenant_is_never_served(
    console: tuple[str, str, str], bus: Bus
) -> None:
    """Defence in depth: a value under acme's key naming nova (a bug upstream) is dropped."""
    url, _, _ = console
    kv = await bus.js.key_value(TENANTS_BUCKET)
    stray = TenantStatus(tenant="nova", router="stray", at=0, itpm=1, otpm=1, input_used=0,
                         output_used=0, inflight=0, max_concurrency=1, queued=0,
                         queued_tokens=0, max_queued_tokens=1, oldest_wait=0, vtc=0)  # fmt: skip
    await kv.put("acme.stray", encode(stray))
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            r = await http.get("/v1/fleet", headers=auth("sk-acme"))
    finally:
        await kv.delete("acme.stray")
    assert r.status_code == 200
    assert "nova" not in r.text and {t["tenant"] for t in r.json()["tenants"]} == {"acme"}


async def test_review_request_lands_in_the_audit_stream(
    console: tuple[str, str, str], bus: Bus
) -> None:
    url, _, _ = console
    body = {
        "question": "How many players registered yesterday?",
        "sql": "SELECT COUNT(*) FROM players",
        "request_id": "ans-1",
        "note": "looks low",
    }
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.post("/v1/sql/review", json=body, headers=auth("sk-acme"))
    assert r.status_code == 202, r.text
    review_id = r.json()["review_id"]
    assert review_id == r.headers["x-request-id"] and r.json()["status"] == "queued"
    stored = await bus.js.get_last_msg("AUDIT", subjects.audit("review", "acme"))
    event = decode(stored.data, AuditEvent)
    assert event.request_id == review_id and event.tenant == "acme"
    assert event.event == "review.requested" and event.actor == "edge.console"
    assert event.question == body["question"] and event.sql == body["sql"]
    assert event.detail == {"note": "looks low", "answer_request_id": "ans-1"}
    listed = await review_requests(bus, "acme", since=300)
    assert review_id in [e.request_id for e in listed]
    assert review_id not in [e.request_id for e in await review_requests(bus, "nova", since=300)]


@pytest.mark.parametrize(
    ("key", "body", "status"),
    [
        (None, {"question": "q", "sql": "SELECT 1"}, 401),
        ("sk-chat-only", {"question": "q", "sql": "SELECT 1"}, 403),
        ("sk-acme", {"question": "q", "sql": ""}, 422),
        ("sk-acme", {"question": "", "sql": "SELECT 1"}, 422),
        ("sk-acme", {"question": "q", "sql": "SELECT 1", "tenant": "nova"}, 422),
        ("sk-acme", {"question": "q", "sql": "SELECT 1", "request_id": "a b"}, 422),
    ],
)
async def test_bad_review_requests_are_refused_typed(
    console: tuple[str, str, str], key: str | None, body: dict[str, Any], status: int
) -> None:
    url, _, _ = console
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.post("/v1/sql/review", json=body, headers=auth(key) if key else {})
    assert r.status_code == status, r.text
    assert r.json()["error"]["type"]


async def test_pages_and_assets_are_served_with_a_strict_policy(
    console: tuple[str, str, str],
) -> None:
    url, _, _ = console
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for path, marker in (("/console", 'id="ask-form"'), ("/console/fleet", 'id="workers"')):
            r = await http.get(path)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
            assert marker in r.text
            assert "script-src 'self'" in r.headers["content-security-policy"]
        js = await http.get("/console/static/ask.js")
        assert js.status_code == 200 and "javascript" in js.headers["content-type"]
        assert (await http.get("/console/static/nothing.js")).status_code == 404
        escape = await http.get("/console/static/%2e%2e/console.py")
        assert escape.status_code == 404
        # The pages carry no data: every figure comes from the authenticated API.
        schema = json.loads((await http.get("/openapi.json")).text)
        assert "/v1/fleet" in schema["paths"] and "/v1/sql/review" in schema["paths"]
