"""The edge on the real fleet (router + llamacpp worker + preprocessor + NATS), driven by
the official `openai` SDK."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import yaml
from openai import AsyncOpenAI

from tests.support.edge import edge_in_process, write_keys
from tests.support.fleet import (
    chat_fleet_in_process,
    provision_pool,
    wait_for_pool,
)

POLICY = {
    "default": {"itpm": 10_000_000, "otpm": 1_000_000, "max_queued_tokens": 50_000_000},
    # Room for one 16-token answer a minute: the second request is over quota.
    "tenants": {"tiny": {"itpm": 10_000_000, "otpm": 20}},
}
KEYS = {
    "sk-acme": {"tenant": "acme"},
    "sk-tiny": {"tenant": "tiny"},
    "sk-narrow": {"tenant": "acme", "models": ["other"]},
}


@pytest.fixture(scope="module")
async def edge(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    from switchyard.bus.connection import connect
    from switchyard.config import Settings

    tmp = tmp_path_factory.mktemp("edge")
    policy = tmp / "tenants.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    keys = write_keys(tmp / "keys.yaml", KEYS)
    pool = "edgellm"
    bus = await connect(Settings(nats_url=nats_url), "edge-test-setup")
    await provision_pool(bus.js, pool)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(bus.close)
        await stack.enter_async_context(
            chat_fleet_in_process(nats_url, pool, policy, engine="llamacpp")
        )
        url = await stack.enter_async_context(
            edge_in_process(nats_url, api_keys_file=keys, chat_pool=pool)
        )
        await wait_for_pool(bus.js, pool)
        yield url


def client(url: str, key: str = "sk-acme") -> AsyncOpenAI:
    # No SDK retries: a 429 must surface, not be retried away.
    return AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


HELLO = [{"role": "user", "content": "Say hello."}]


async def test_chat_completion_non_streaming(edge: str) -> None:
    out = await client(edge).chat.completions.create(
        model="default",
        messages=HELLO,
        max_tokens=8,
        temperature=0,  # type: ignore[arg-type]
    )
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage is not None and 1 <= out.usage.completion_tokens <= 8
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


async def test_chat_completion_streaming_with_usage(edge: str) -> None:
    stream = await client(edge).chat.completions.create(
        model="default", messages=HELLO, max_tokens=8, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert 1 <= chunks[-1].usage.completion_tokens <= 8
    assert len({c.id for c in chunks}) == 1


async def test_response_format_json_schema(edge: str) -> None:
    schema = {
        "type": "object",
        "properties": {"greeting": {"type": "string", "maxLength": 20}},
        "required": ["greeting"],
    }
    out = await client(edge).chat.completions.create(
        model="default", messages=HELLO, max_tokens=24, temperature=0,  # type: ignore[arg-type]
        response_format={"type": "json_schema",
                         "json_schema": {"name": "hello", "schema": schema, "strict": True}},
    )  # fmt: skip
    content = out.choices[0].message.content or ""
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content)["greeting"], str)
    else:  # cut by max_tokens: still a prefix of the constrained JSON
        assert content.startswith("{")


async def test_quota_rejection_is_rate_limit_error_with_retry_after(edge: str) -> None:
    tiny = client(edge, "sk-tiny")
    await tiny.chat.completions.create(model="default", messages=HELLO, max_tokens=16)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as info:
        await tiny.chat.completions.create(model="default", messages=HELLO, max_tokens=16)  # type: ignore[arg-type]
    err = info.value
    assert int(err.response.headers["retry-after"]) >= 1
    body = err.response.json()["error"]
    assert body["code"] == "over_quota" and body["request_id"]
    assert err.response.headers["x-request-id"] == body["request_id"]


async def test_quota_rejection_of_a_stream_is_a_429_too(edge: str) -> None:
    tiny = client(edge, "sk-tiny")
    with pytest.raises(openai.RateLimitError):
        await tiny.chat.completions.create(
            model="default",
            messages=HELLO,
            max_tokens=16,
            stream=True,  # type: ignore[arg-type]
        )


async def test_bad_key_is_authentication_error(edge: str) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        await client(edge, "sk-wrong").chat.completions.create(model="default", messages=HELLO)  # type: ignore[arg-type]
    assert info.value.response.json()["error"]["request_id"]
    with pytest.raises(openai.AuthenticationError):
        await client(edge, "sk-wrong").models.list()


async def test_key_without_the_model_is_forbidden(edge: str) -> None:
    with pytest.raises(openai.PermissionDeniedError):
        await client(edge, "sk-narrow").chat.completions.create(model="default", messages=HELLO)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        await client(edge).chat.completions.create(model="nope", messages=HELLO)  # type: ignore[arg-type]
    assert [m.id for m in (await client(edge).models.list()).data] == ["default"]
    assert [m.id for m in (await client(edge, "sk-narrow").models.list()).data] == []


async def test_invalid_request_is_422_with_the_field(edge: str) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as info:
        await client(edge).chat.completions.create(model="default", messages=[])
    assert info.value.response.json()["error"]["param"] == "messages"


async def test_body_size_cap_is_413(edge: str) -> None:
    async with httpx.AsyncClient(base_url=edge) as http:
        r = await http.post(
            "/v1/chat/completions", content=b"x" * (2 * 1024 * 1024),
            headers={"Authorization": "Bearer sk-acme", "Content-Type": "application/json"},
        )  # fmt: skip
    assert r.status_code == 413 and r.json()["error"]["request_id"]


async def test_health_ready_and_metrics(edge: str) -> None:
    async with httpx.AsyncClient(base_url=edge) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = await http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["workers"] >= 1
        assert (await http.get("/readyz", params={"pool": "nosuchpool"})).status_code == 503
        metrics = (await http.get("/metrics")).text
    assert 'sy_edge_requests_total{route="/v1/chat/completions",status="200"}' in metrics
    assert "sy_edge_request_duration_seconds_bucket" in metrics


async def test_idempotent_retry_returns_the_same_generation(edge: str) -> None:
    headers = {"Idempotency-Key": "retry-me-1"}
    acme = client(edge)
    first = await acme.chat.completions.with_raw_response.create(
        model="default",
        messages=HELLO,
        max_tokens=8,
        extra_headers=headers,  # type: ignore[arg-type]
    )
    again = await acme.chat.completions.with_raw_response.create(
        model="default",
        messages=HELLO,
        max_tokens=8,
        extra_headers=headers,  # type: ignore[arg-type]
    )
    assert again.headers.get("idempotent-replayed") == "true"
    one, two = first.parse(), again.parse()
    assert one.id == two.id and one.choices[0].message.content == two.choices[0].message.content
    # Another tenant with the same key is a different request, never the first tenant's result.
    other = await client(edge, "sk-tiny").chat.completions.with_raw_response.create(
        model="default",
        messages=HELLO,
        max_tokens=1,
        extra_headers=headers,  # type: ignore[arg-type]
    )
    assert other.headers.get("idempotent-replayed") is None and other.parse().id != one.id
