"""`POST /v1/sql/ask` on the real Text2SQL fleet (validator, executor, router, a llama.cpp
worker, sqlflow) over NATS and MariaDB, with the edge in process and plain HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.aio.msg import Msg

from services.edge import lifecycle
from services.sqlflow import metrics as sqlflow_metrics
from switchyard import subjects
from switchyard.bus import rpc
from switchyard.bus.connection import Bus, connect
from switchyard.codec import decode
from switchyard.config import Settings
from switchyard.errors import DecodeError
from switchyard.messages.sql import ExecuteReply, SqlAnswer
from switchyard.text2sql.knowledge import KnowledgeStore
from tests.support.edge import edge_in_process, write_keys
from tests.support.fleet import provision_pool
from tests.support.poll import until
from tests.support.proxy import cuttable_proxy
from tests.support.sqlenv import SqlEnv
from tests.support.sqlflow import KNOWLEDGE, text2sql_fleet

STORE = KnowledgeStore(KNOWLEDGE)
VERIFIED = STORE.load("acme").verified[0]
KEYS: dict[str, dict[str, Any]] = {
    "sk-acme": {"tenant": "acme"},
    "sk-nova": {"tenant": "nova"},
    "sk-chat-only": {"tenant": "acme", "pools": ["llm", "agent"]},
    # A real key whose tenant has no SQL policy: the orchestrator refuses it, typed.
    "sk-ghost": {"tenant": "ghost"},
}
ENVELOPE = {"id", "tenant", "reply", "trace", "deadline", "kind", "v", "ts"}


def auth(key: str = "sk-acme") -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def sse(
    http: httpx.AsyncClient, body: dict[str, Any], key: str = "sk-acme"
) -> tuple[httpx.Response, list[str]]:
    """The response and its non-empty SSE lines."""
    async with http.stream("POST", "/v1/sql/ask", json=body, headers=auth(key)) as r:
        lines = [line async for line in r.aiter_lines() if line]
    return r, lines


def data_of(lines: list[str]) -> list[Any]:
    """The `data:` payloads in order, `[DONE]` as the string."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            raw = line.removeprefix("data: ")
            out.append(raw if raw == "[DONE]" else json.loads(raw))
    return out


async def test_silence_is_504_and_an_error_event_with_heartbeats(
    nats_url: str, bus: Bus, tmp_path: Path, unique: str
) -> None:
    # First in the module on purpose: no sqlflow runs yet, so nothing answers the ask
    # (stored in INGRESS; a later sqlflow reads it past its deadline and answers
    # `expired` to an inbox nobody listens on).
    await provision_pool(bus.js, f"q{unique}")
    keys = write_keys(tmp_path / "keys.yaml", KEYS)
    async with (
        edge_in_process(nats_url, api_keys_file=keys, sql_timeout=1.0, sql_idle_timeout=1.0,
                        sse_heartbeat=0.2, first_frame_grace=0.1) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):  # fmt: skip
        r = await http.post("/v1/sql/ask", json={"question": "Anyone there?"}, headers=auth())
        assert r.status_code == 504, r.text
        err = r.json()["error"]
        assert err["code"] == "timeout" and err["request_id"] == r.headers["x-request-id"]

        r, lines = await sse(http, {"question": "Anyone there?", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert ": keep-alive" in lines[:-2]  # heartbeats during the silence
    *_, event, done = data_of(lines)
    assert done == "[DONE]"
    assert event["type"] == "error" and event["error"]["code"] == "timeout"
    assert event["error"]["request_id"] == r.headers["x-request-id"]


async def test_a_question_the_bus_cannot_take_is_a_typed_503_with_retry_after(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The edge's connection to NATS drops: the question is tried for the edge's patience,
    then refused as a chat is, `bus_unavailable` with Retry-After (not an untyped 503)."""
    monkeypatch.setattr(lifecycle, "INGRESS_PATIENCE", 0.5)
    keys = write_keys(tmp_path / "keys.yaml", KEYS)
    port = urllib.parse.urlsplit(nats_url).port
    assert port is not None
    async with (
        cuttable_proxy(port) as proxy,
        # A short deadline: the publish buffered while cut reaches INGRESS on reconnect, and
        # the sqlflow of the next tests then reads it expired instead of answering it.
        edge_in_process(proxy.url, api_keys_file=keys, sql_timeout=1.0) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):  # fmt: skip
        await proxy.cut()
        try:
            r = await http.post("/v1/sql/ask", json={"question": "Anyone there?"},
                                headers=auth())  # fmt: skip
        finally:
            await proxy.open()
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "bus_unavailable" and r.headers["retry-after"] == "1", r.headers
    assert err["request_id"] == r.headers["x-request-id"]


@pytest.fixture(scope="module")
async def sql_edge(
    nats_url: str, sqlenv: SqlEnv, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    tmp = tmp_path_factory.mktemp("edge-sql")
    keys = write_keys(tmp / "keys.yaml", KEYS)
    setup = await connect(Settings(nats_url=nats_url), "edge-sql-test")
    try:
        async with (
            text2sql_fleet(setup, nats_url, sqlenv, tmp / "index", uuid.uuid4().hex[:10]),
            # A generous grace: the orchestrator's refusal of a stream (`unknown_tenant`)
            # always lands before the 200 is committed, so the test is not a race.
            edge_in_process(nats_url, api_keys_file=keys, first_frame_grace=10.0) as url,
        ):
            yield url
    finally:
        await setup.close()


async def executed_rows(bus: Bus, sqlenv: SqlEnv, tenant: str, sql: str) -> list[list[Any]]:
    reply = await rpc.request(
        bus.nc, subjects.SQL_EXECUTE, sqlenv.signed(tenant, sql), ExecuteReply, timeout=15
    )
    assert reply.ok, reply.error
    return reply.rows


async def test_verified_question_answers_with_the_keys_tenant_rows(
    sql_edge: str, bus: Bus, sqlenv: SqlEnv
) -> None:
    async with httpx.AsyncClient(base_url=sql_edge, timeout=120) as http:
        r = await http.post("/v1/sql/ask", json={"question": VERIFIED.question}, headers=auth())
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["status"] == "ok" and out["path"] == "verified", out
    assert out["request_id"] == r.headers["x-request-id"]
    assert out["rows"] and out["columns"] and out["sql"]
    assert {"verified", "validation", "rows"} <= out["stages"].keys()
    assert not ENVELOPE & out.keys()
    # The key's tenant's data: acme's rows, as the executor returns them for acme.
    assert out["rows"] == await executed_rows(bus, sqlenv, "acme", VERIFIED.sql)
    # The summary is written from the facts, which come with it (the template by default).
    assert out["summary_source"] == "template" and out["summary"]
    assert out["facts"]["row_count"] == len(out["rows"])


async def test_streamed_question_is_stages_then_the_answer_then_done(sql_edge: str) -> None:
    async with httpx.AsyncClient(base_url=sql_edge, timeout=120) as http:
        # no_cache: the other test's answer must not turn this into an exact-cache hit.
        body = {"question": VERIFIED.question, "stream": True, "no_cache": True}
        r, lines = await sse(http, body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    *events, answer, done = data_of(lines)
    assert done == "[DONE]"
    stages = [e for e in events if e["type"] == "stage"]
    progress = [e for e in events if e["type"] == "progress"]
    # sqlflow's keepalives, if any came after the first-frame grace, are progress events
    assert stages and len(stages) + len(progress) == len(events), events
    assert all(set(p) == {"type", "stage", "seconds", "elapsed", "tokens"} for p in progress)
    assert [s["stage"] for s in stages][:2] == ["verified", "sql"]
    assert all(set(s) == {"type", "stage", "seconds", "data"} for s in stages)
    assert answer["type"] == "answer" and answer["status"] == "ok"
    assert answer["path"] == "verified" and answer["rows"]
    assert answer["request_id"] == r.headers["x-request-id"]
    [summary] = [s for s in stages if s["stage"] == "summary"]
    facts = summary["data"]["facts"]
    assert (facts["kind"], facts["row_count"]) == (answer["facts"]["kind"], len(answer["rows"]))
    assert summary["data"]["text"] == answer["summary"]


async def test_the_body_never_chooses_the_tenant(sql_edge: str, sqlenv: SqlEnv) -> None:
    nova = STORE.load("nova")
    asked = {q.question for q in nova.verified}
    acme_only = next(q for q in STORE.load("acme").verified if q.question not in asked)
    async with httpx.AsyncClient(base_url=sql_edge, timeout=300) as http:
        body = {"question": acme_only.question, "tenant": "nova"}
        r = await http.post("/v1/sql/ask", json=body, headers=auth())
        assert r.status_code == 422 and r.json()["error"]["param"] == "tenant"
        # nova's key asks as nova: acme's verified query is not nova's, and whatever SQL
        # ran, ran on nova's schema only.
        r = await http.post("/v1/sql/ask", json={"question": acme_only.question},
                            headers=auth("sk-nova"))  # fmt: skip
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["path"] != "verified" or out["sql"] != acme_only.sql, out
    if out["sql"]:
        assert set(re.findall(r"`([^`]+)`\.`", out["sql"])) == {sqlenv.schema("nova")}


async def test_key_without_the_sql_pool_is_403(sql_edge: str) -> None:
    async with httpx.AsyncClient(base_url=sql_edge, timeout=30) as http:
        body = {"question": VERIFIED.question}
        r = await http.post("/v1/sql/ask", json=body, headers=auth("sk-chat-only"))
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        r = await http.post("/v1/sql/ask", json=body)
        assert r.status_code == 401


async def test_tenant_without_a_sql_policy_is_a_typed_403(sql_edge: str) -> None:
    async with httpx.AsyncClient(base_url=sql_edge, timeout=120) as http:
        r = await http.post("/v1/sql/ask", json={"question": "How many players?"},
                            headers=auth("sk-ghost"))  # fmt: skip
        assert r.status_code == 403, r.text
        err = r.json()["error"]
        assert err["code"] == "unknown_tenant" and err["type"] == "permission_error"
        assert err["request_id"] == r.headers["x-request-id"]
        # A stream refused before its first event is a real status too, not a 200 SSE.
        r, _ = await sse(http, {"question": "How many players?", "stream": True}, "sk-ghost")
    assert r.status_code == 403


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (b'{"question": "How many', None),  # not JSON
        (b'["How many players?"]', None),
        (b'{"question": ""}', "question"),
        (b'{"question": "x", "max_rows": 10001}', "max_rows"),
        (b'{"question": "x", "sql": ""}', "sql"),
        (b'{"question": "x", "stream": "maybe"}', "stream"),
        (json.dumps({"question": "x" * 4097}).encode(), "question"),
    ],
)
async def test_malformed_bodies_are_typed_422(
    sql_edge: str, content: bytes, param: str | None
) -> None:
    async with httpx.AsyncClient(base_url=sql_edge, timeout=30) as http:
        r = await http.post("/v1/sql/ask", content=content,
                            headers={**auth(), "Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["request_id"]
    if param is not None:
        assert err["param"] == param


async def test_client_leaving_mid_stream_cancels_the_question(sql_edge: str, bus: Bus) -> None:
    """The edge publishes `cancel.<id>` when its client goes before the answer; sqlflow
    then answers the question `cancelled` on RES (where nothing else would say so)."""
    answers: list[SqlAnswer] = []

    async def seen(msg: Msg) -> None:
        with contextlib.suppress(DecodeError):
            answers.append(decode(msg.data, SqlAnswer))

    sub = await bus.nc.subscribe(subjects.res("sql", "acme"), cb=seen)
    # Names a view, so it goes to generation (slow on the CPU model) whatever the intent.
    body = {"question": "List every server with its region and opening day", "stream": True,
            "no_cache": True}  # fmt: skip
    try:
        async with (
            httpx.AsyncClient(base_url=sql_edge, timeout=60) as http,
            http.stream("POST", "/v1/sql/ask", json=body, headers=auth()) as r,
        ):
            assert r.status_code == 200
            rid = r.headers["x-request-id"]
            async for line in r.aiter_lines():
                event = json.loads(line[6:]) if line.startswith("data: {") else {}
                if event.get("type") == "stage" and event.get("stage") == "scope":
                    break  # leave with the SQL being generated
        await until(lambda: any(a.request_id == rid for a in answers), timeout=30,
                    what="the cancelled answer")  # fmt: skip
    finally:
        await sub.unsubscribe()
    (mine,) = [a for a in answers if a.request_id == rid]
    assert mine.status == "error" and mine.error and mine.error.code == "cancelled", mine


async def stored_answers(bus: Bus, request_id: str) -> list[SqlAnswer]:
    """Every answer RES holds for `request_id`."""
    found: list[SqlAnswer] = []
    sub = await bus.js.subscribe(subjects.res("sql", "acme"), ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except TimeoutError:
                return found
            with contextlib.suppress(DecodeError):
                answer = decode(msg.data, SqlAnswer)
                if answer.request_id == request_id:
                    found.append(answer)
    finally:
        await sub.unsubscribe()


async def test_a_question_retried_with_its_idempotency_key_is_answered_once(
    sql_edge: str, bus: Bus
) -> None:
    """Two tries at once and one after, all with the same key: one run of the question
    (sqlflow counts one answer, RES holds one), the same answer for all three."""
    ran = sqlflow_metrics.ANSWERS.labels("verified", "ok")
    ran_before = ran._value.get()
    body = {"question": VERIFIED.question, "no_cache": True}
    headers = {**auth(), "Idempotency-Key": f"ask-once-{uuid.uuid4().hex[:8]}"}
    async with httpx.AsyncClient(base_url=sql_edge, timeout=120) as http:
        tries = await asyncio.gather(
            *(http.post("/v1/sql/ask", json=body, headers=headers) for _ in range(2))
        )
        later = await http.post("/v1/sql/ask", json=body, headers=headers)
        # The key is the question's: another question under it is refused, not answered.
        other = await http.post("/v1/sql/ask", json={**body, "max_rows": 5}, headers=headers)
    assert all(r.status_code == 200 for r in (*tries, later)), [r.text for r in tries]
    (original,) = [r for r in tries if "idempotent-replayed" not in r.headers]
    rid = original.headers["x-request-id"]
    for retry in (*[r for r in tries if r is not original], later):
        assert retry.headers.get("idempotent-replayed") == "true"
        assert retry.headers["x-request-id"] == rid
        assert retry.json() == original.json()
    assert original.json()["request_id"] == rid and original.json()["status"] == "ok"
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency"
    assert ran._value.get() == ran_before + 1, "the question ran more than once"
    assert len(await stored_answers(bus, rid)) == 1
