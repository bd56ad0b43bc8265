"""The session key of a chat completion (`X-Session-ID`, else `user`) through the real edge,
preprocessor, router and a `sim` worker: what the router is handed on `req.llm.<tenant>`
(read off the wire), what a bad key is answered with, and that tenants never share one."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import yaml
from pydantic import TypeAdapter

from switchyard import subjects
from switchyard.codec import decode
from switchyard.envelope import SessionId
from switchyard.messages.inference import GenerateRequest
from switchyard.openai_compat import InvalidSession, requested_session, tenant_session
from tests.support.edge import edge_in_process, write_keys
from tests.support.fleet import (
    chat_fleet_in_process,
    provision_pool,
    wait_for_pool,
)
from tests.support.poll import until

POOL = "edgesess"
TENANTS = {"sk-sess-a": "sessa", "sk-sess-b": "sessb"}
POLICY = {"default": {"itpm": 10_000_000, "otpm": 1_000_000, "max_queued_tokens": 50_000_000}}
HELLO = [{"role": "user", "content": "Say hello."}]


@dataclass
class Edge:
    url: str
    # request id -> the GenerateRequest the preprocessor published for the router
    seen: dict[str, GenerateRequest] = field(default_factory=dict)


@pytest.fixture(scope="module")
async def edge(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Edge]:
    from switchyard.bus.connection import connect
    from switchyard.config import Settings

    tmp = tmp_path_factory.mktemp("edge-session")
    policy = tmp / "tenants.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    keys = write_keys(tmp / "keys.yaml", {k: {"tenant": t} for k, t in TENANTS.items()})
    bus = await connect(Settings(nats_url=nats_url), "edge-session-test")
    await provision_pool(bus.js, POOL)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(bus.close)
        out = Edge(url="")

        async def on_req(msg: Any) -> None:
            req = decode(msg.data, GenerateRequest)
            out.seen[req.id] = req

        # A plain subscription sees every message published into the REQ stream on these
        # subjects, whatever the router's consumer does with it.
        for tenant in TENANTS.values():
            sub = await bus.nc.subscribe(subjects.req("llm", tenant), cb=on_req)
            stack.push_async_callback(sub.unsubscribe)
        await stack.enter_async_context(chat_fleet_in_process(nats_url, POOL, policy))
        out.url = await stack.enter_async_context(
            edge_in_process(nats_url, api_keys_file=keys, chat_pool=POOL)
        )
        await wait_for_pool(bus.js, POOL)
        yield out


async def chat(
    edge: Edge, key: str = "sk-sess-a", *, stream: bool = False,
    headers: list[tuple[str, str]] | None = None, **body: Any,
) -> httpx.Response:  # fmt: skip
    """One chat completion, read whole (a stream too); `headers` as pairs, so a header can
    be sent twice."""
    payload = {"model": "default", "messages": HELLO, "max_tokens": 4, "stream": stream, **body}
    async with httpx.AsyncClient(base_url=edge.url, timeout=60) as http:
        r = await http.post(
            "/v1/chat/completions", json=payload,
            headers=[("Authorization", f"Bearer {key}"), *(headers or [])],
        )  # fmt: skip
        await r.aread()
    return r


async def routed(edge: Edge, r: httpx.Response) -> GenerateRequest:
    """What the router was handed for the answered request `r`."""
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]
    await until(lambda: rid in edge.seen, timeout=10, what=f"request {rid} on req.llm")
    return edge.seen[rid]


def sse_text(r: httpx.Response) -> str:
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", r.text[-300:]
    chunks = [json.loads(e) for e in events[:-1]]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


async def test_header_is_the_session_streaming_or_not(edge: Edge) -> None:
    one = await chat(edge, headers=[("X-Session-ID", "s1")])
    assert one.json()["choices"][0]["message"]["content"]
    streamed = await chat(edge, stream=True, headers=[("x-session-id", "s1")])
    assert sse_text(streamed)
    expected = tenant_session("sessa", "s1")
    assert (await routed(edge, one)).session == expected
    assert (await routed(edge, streamed)).session == expected


async def test_user_alone_is_the_session(edge: Edge) -> None:
    # What OpenAI asks `user` to be, an end user's id, is often an e-mail address.
    r = await chat(edge, user="alice@example.com")
    assert (await routed(edge, r)).session == tenant_session("sessa", "alice@example.com")
    streamed = await chat(edge, stream=True, user="alice@example.com")
    assert sse_text(streamed)
    assert (await routed(edge, streamed)).session == tenant_session("sessa", "alice@example.com")


async def test_header_wins_over_user(edge: Edge) -> None:
    r = await chat(edge, headers=[("X-Session-ID", "from-header")], user="from-user")
    assert (await routed(edge, r)).session == tenant_session("sessa", "from-header")
    # The header wins even where `user` would be refused: `user` is not the key then.
    r = await chat(edge, headers=[("X-Session-ID", "from-header")], user="has space")
    assert (await routed(edge, r)).session == tenant_session("sessa", "from-header")


async def test_no_header_and_no_user_is_no_session(edge: Edge) -> None:
    r = await chat(edge)
    assert (await routed(edge, r)).session is None
    r = await chat(edge, stream=True)
    assert (await routed(edge, r)).session is None


async def test_two_tenants_with_one_key_get_two_sessions(edge: Edge) -> None:
    a1 = await routed(edge, await chat(edge, "sk-sess-a", headers=[("X-Session-ID", "shared")]))
    a2 = await routed(edge, await chat(edge, "sk-sess-a", user="shared"))
    b = await routed(edge, await chat(edge, "sk-sess-b", headers=[("X-Session-ID", "shared")]))
    assert (a1.tenant, b.tenant) == ("sessa", "sessb")
    assert a1.session is not None and a1.session == a2.session  # stable within a tenant
    assert b.session is not None and b.session != a1.session


@pytest.mark.parametrize(
    ("headers", "user", "param", "says"),
    [
        ([("X-Session-ID", "has space")], None, "X-Session-ID", "' ' at position 3"),
        ([("X-Session-ID", "")], None, "X-Session-ID", "is empty"),
        ([("X-Session-ID", "x" * 257)], None, "X-Session-ID", "has 257 characters"),
        ([("X-Session-ID", "s1"), ("X-Session-ID", "s2")], None, "X-Session-ID", "2 times"),
        # A bad header is refused, not passed over for a good `user`.
        ([("X-Session-ID", "tab\there")], "fine", "X-Session-ID", "'\\t' at position 3"),
        ([], "caf\u00e9", "user", "'\u00e9' at position 3"),
        ([], "", "user", "is empty"),
        ([], "line\nbreak", "user", "'\\n' at position 4"),
    ],
)
async def test_a_bad_session_key_is_a_typed_422(
    edge: Edge, headers: list[tuple[str, str]], user: str | None, param: str, says: str
) -> None:
    body = {} if user is None else {"user": user}
    for stream in (False, True):
        r = await chat(edge, stream=stream, headers=headers, **body)
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == "invalid_session"
        assert err["param"] == param and says in err["message"], err
        assert err["request_id"] == r.headers["x-request-id"]
        assert err["request_id"] not in edge.seen  # refused before anything was published


async def test_an_overlong_user_is_refused_by_the_schema(edge: Edge) -> None:
    r = await chat(edge, user="u" * 257)
    assert r.status_code == 422 and r.json()["error"]["param"] == "user", r.text


def test_requested_session_rules() -> None:
    assert requested_session([], None) is None
    assert requested_session(["h"], "u") == "h"
    assert requested_session([], "u") == "u"
    longest = "~!" * 128  # both ends of the allowed range, at the cap
    assert requested_session([longest], None) == longest
    for bad in ("", " ", "a\x7fb", "x" * 257, "\u0430"):  # the last is a Cyrillic "a"
        with pytest.raises(InvalidSession):
            requested_session([bad], None)


def test_tenant_session_is_a_session_id_and_depends_on_both() -> None:
    sid = tenant_session("sessa", "~" * 256)
    assert TypeAdapter(SessionId).validate_python(sid) == sid  # the envelope takes it
    assert len(sid) == 32
    ids = {tenant_session(t, k) for t in ("a", "a-b", "a_b") for k in ("b", "b-c", "c")}
    assert len(ids) == 9
