"""`POST /v1/agent/step` on the real fleet: edge -> agent.in -> preprocessor -> router ->
`llamacpp` worker (SmolLM2 on the CPU) -> the action, over real NATS and real HTTP.

One fleet serves the module (the model loads once). Both endpoints that return results
(agent steps and chat completions) are checked for tenant isolation with two keys.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonschema  # type: ignore[import-untyped]
import pytest

from services.edge.agent import StepIn
from services.edge.app import create_app
from services.edge.settings import EdgeSettings
from switchyard.agentactions import parse_actions
from switchyard.ids import new_id
from switchyard.messages.agent import MAX_FRAMES, answer_schema
from tests.integration.test_agent_path import png_frame, png_with_header
from tests.support.edge import agent_fleet_with_edge, write_keys

KEYS = {"sk-alpha": {"tenant": "alpha"}, "sk-beta": {"tenant": "beta"}}
FLEET_FRAME_BYTES = 256 * 1024  # the preprocessor's cap
EDGE_FRAME_BYTES = 512 * 1024  # the edge's HTTP cap per frame
OPTIONS = {"max_tokens": 24}


def auth(key: str = "sk-alpha") -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
async def edge(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    pool = f"ea{new_id().lower()[-8:]}"
    keys = write_keys(tmp_path_factory.mktemp("edge-agent") / "keys.yaml", KEYS)
    async with agent_fleet_with_edge(
        nats_url, pool, keys, engine="llamacpp",
        preprocessor={"max_frame_bytes": FLEET_FRAME_BYTES},
        edge={"max_frame_bytes": EDGE_FRAME_BYTES},
    ) as url:  # fmt: skip
        yield url


def http(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=120)


def json_step(frames: list[bytes], **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "frames": [{"data": base64.b64encode(f).decode(), "mime": "image/png"} for f in frames],
        "session": f"ep-{new_id()[-8:]}", "frame_ts": time.time(), "stale_after": 120.0,
        "goal": "collect the daily reward", "options": OPTIONS,
    }  # fmt: skip
    return {**body, **over}


def assert_action(resp: httpx.Response, sent_ts: float) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    assert out["status"] == "ok"
    assert out["request_id"] == resp.headers["x-request-id"]
    assert out["frame_ts"] == pytest.approx(sent_ts)
    answer = out["answer"]
    if isinstance(answer, str):  # `compact`, the default format: its text
        actions = parse_actions(answer, "compact")
    else:
        jsonschema.validate(answer, answer_schema())
        actions = parse_actions(json.dumps(answer), "json")
    assert [a.model_dump() for a in actions] == out["actions"] and len(actions) == 1
    assert out["usage"]["prompt_tokens"] > 0
    assert out["timings"]["edge"] > 0 and out["timings"]["total"] > 0
    return out


def assert_error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err: dict[str, Any] = resp.json()["error"]
    assert err["code"] == code, err
    assert err["request_id"] == resp.headers["x-request-id"]
    return err


async def test_multipart_step_returns_a_schema_valid_action(edge: str) -> None:
    ts = time.time()
    data = {"session": f"ep-{new_id()[-8:]}", "frame_ts": str(ts), "stale_after": "120",
            "goal": "collect the daily reward", "options": json.dumps(OPTIONS)}  # fmt: skip
    async with http(edge) as c:
        resp = await c.post("/v1/agent/step", headers=auth(), data=data,
                            files=[("frames", ("f0.png", png_frame(0), "image/png"))])  # fmt: skip
    out = assert_action(resp, ts)
    assert out["session"] == data["session"] and out["worker"]


async def test_base64_json_step_with_two_frames_and_history(edge: str) -> None:
    body = json_step(
        [png_frame(1), png_frame(2)], step=1, history=['{"type":"back"}'],
        options={**OPTIONS, "action_format": "json"},  # the other format than the default
    )  # fmt: skip
    async with http(edge) as c:
        resp = await c.post("/v1/agent/step", headers=auth(), json=body)
    assert assert_action(resp, body["frame_ts"])["step"] == 1


async def test_hostile_frames_get_typed_4xx_and_the_next_step_still_works(edge: str) -> None:
    async with http(edge) as c:
        # Decompression bomb: a tiny PNG announcing 10^10 pixels, refused undecoded.
        bomb = await c.post("/v1/agent/step", headers=auth(),
                            json=json_step([png_with_header(100_000, 100_000)]))  # fmt: skip
        assert_error(bomb, 413, "oversized")
        junk = await c.post("/v1/agent/step", headers=auth(),
                            json=json_step([b"not an image at all\n" * 8]))  # fmt: skip
        assert_error(junk, 422, "invalid_request")
        # Over the fleet's byte cap but under the edge's: the preprocessor's typed refusal.
        big = b"\x89PNG\r\n\x1a\n" + b"\x00" * (FLEET_FRAME_BYTES + 1)
        assert_error(await c.post("/v1/agent/step", headers=auth(), json=json_step([big])),
                     413, "oversized")  # fmt: skip
        # Over the edge's own cap: refused at the door with a clear message.
        huge = b"\x89PNG\r\n\x1a\n" + b"\x00" * (EDGE_FRAME_BYTES + 1)
        err = assert_error(
            await c.post("/v1/agent/step", headers=auth(),
                         files=[("frames", ("h.png", huge, "image/png"))],
                         data={"session": "s1", "frame_ts": str(time.time())}),
            413, "oversized",
        )  # fmt: skip
        assert f"over the {EDGE_FRAME_BYTES}-byte cap" in err["message"]
        assert_error(await c.post("/v1/agent/step", headers=auth(),
                                  json=json_step([png_frame(3)] * 3)),
                     422, "invalid_request")  # fmt: skip
        body = json_step([png_frame(4)])
        assert_action(await c.post("/v1/agent/step", headers=auth(), json=body), body["frame_ts"])


async def test_stale_frame_is_answered_409_stale(edge: str) -> None:
    body = json_step([png_frame(5)], frame_ts=time.time() - 3600, stale_after=1.0)
    async with http(edge) as c:
        resp = await c.post("/v1/agent/step", headers=auth(), json=body)
    err = assert_error(resp, 409, "stale")
    assert "old" in err["message"]


async def test_no_endpoint_takes_a_tenant_from_the_body(edge: str) -> None:
    async with http(edge) as c:
        spec = (await c.get("/openapi.json")).json()
        resp = await c.post("/v1/agent/step", headers=auth("sk-beta"),
                            json=json_step([png_frame(6)], tenant="alpha"))  # fmt: skip
    assert_error(resp, 422, "invalid_request")

    def properties(schema: Any) -> set[str]:
        if isinstance(schema, dict):
            if "$ref" in schema:
                name = schema["$ref"].rsplit("/", 1)[-1]
                return properties(spec["components"]["schemas"][name])
            found = set(schema.get("properties", {}))
            for value in schema.values():
                found |= properties(value) if isinstance(value, dict | list) else set()
            return found
        if isinstance(schema, list):
            return set().union(*(properties(v) for v in schema)) if schema else set()
        return set()

    bodies = [op["requestBody"] for item in spec["paths"].values() for op in item.values()
              if isinstance(op, dict) and "requestBody" in op]  # fmt: skip
    assert len(bodies) >= 2  # chat completions and agent steps
    assert all("tenant" not in properties(b) for b in bodies)
    for item in spec["paths"].values():
        for op in item.values():
            assert all(p["name"] != "tenant" for p in op.get("parameters", []))


async def test_a_tenant_never_reads_another_tenants_results(edge: str) -> None:
    """Same Idempotency-Key, same body, two keys: each tenant gets its own run."""
    key = f"idem-{new_id()}"
    body = json_step([png_frame(7)])
    async with http(edge) as c:
        a1 = await c.post("/v1/agent/step", headers={**auth("sk-alpha"), "Idempotency-Key": key},
                          json=body)  # fmt: skip
        a = assert_action(a1, body["frame_ts"])
        b1 = await c.post("/v1/agent/step", headers={**auth("sk-beta"), "Idempotency-Key": key},
                          json=body)  # fmt: skip
        b = assert_action(b1, body["frame_ts"])
        assert b["request_id"] != a["request_id"] and "idempotent-replayed" not in b1.headers
        # The owner's retry is a replay of its own result, not a new run.
        a2 = await c.post("/v1/agent/step", headers={**auth("sk-alpha"), "Idempotency-Key": key},
                          json=body)  # fmt: skip
        assert a2.status_code == 200 and a2.headers["idempotent-replayed"] == "true"
        assert a2.json()["request_id"] == a["request_id"]

        # The same on the chat endpoint.
        chat = {"model": "default", "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4, "temperature": 0}  # fmt: skip
        ckey = f"idem-chat-{new_id()}"
        ca = await c.post("/v1/chat/completions", json=chat,
                          headers={**auth("sk-alpha"), "Idempotency-Key": ckey})  # fmt: skip
        cb = await c.post("/v1/chat/completions", json=chat,
                          headers={**auth("sk-beta"), "Idempotency-Key": ckey})  # fmt: skip
        assert ca.status_code == cb.status_code == 200, (ca.text, cb.text)
        assert ca.json()["id"] != cb.json()["id"] and "idempotent-replayed" not in cb.headers


def test_openapi_documents_both_encodings() -> None:
    op = create_app(EdgeSettings()).openapi()["paths"]["/v1/agent/step"]["post"]
    assert set(op["requestBody"]["content"]) == {"application/json", "multipart/form-data"}
    assert {"409", "413", "422", "429", "504"} <= set(op["responses"])
    # Both encodings are the step's own fields (the bus's caps) and its frames.
    content = op["requestBody"]["content"]
    for encoding in ("application/json", "multipart/form-data"):
        schema = content[encoding]["schema"]
        assert set(schema["properties"]) == {"frames", *StepIn.model_fields}, encoding
        assert set(schema["required"]) == {"frames", "session", "frame_ts"}, encoding
        assert schema["properties"]["history"]["maxItems"] == 256
        assert schema["properties"]["goal"]["maxLength"] == 2048
        assert schema["properties"]["frames"]["maxItems"] == MAX_FRAMES
    form = content["multipart/form-data"]["schema"]["properties"]
    assert form["sent_at"]["type"] == "number" and "anyOf" not in form["sent_at"]
    assert form["options"]["type"] == "string"
