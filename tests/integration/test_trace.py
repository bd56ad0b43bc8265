"""`sy trace`: one request's path rebuilt from the streams, hop by hop, with the client's
W3C trace context carried from the HTTP request to the result."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from switchyard.bus.connection import Bus
from switchyard.cli.app import app
from switchyard.codec import decode
from switchyard.errors import SwitchyardError
from switchyard.forensics.trace import find
from switchyard.ids import new_id
from switchyard.messages.inference import GenerateResult
from switchyard.tracing import trace_id
from tests.support.edge import edge_in_process, write_keys
from tests.support.fleet import (
    preprocessor_in_process,
    provision_pool,
    router_in_process,
    wait_for_pool,
    worker_in_process,
)

CLIENT_TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
# The edge prepares its chat itself, then stores it on REQ (to run) and INGRESS (the record).
PATH = ["created", "prepared", "stored", "admitted", "dispatched", "started", "first token",
        "finished", "result stored"]  # fmt: skip


@contextlib.asynccontextmanager
async def sim_fleet_with_edge(bus: Bus, nats_url: str, tmp: Path, pool: str,  # type: ignore[no-untyped-def]
                              preprocessor: bool = False):  # fmt: skip
    """Worker, router and edge (chat from the edge needs no preprocessor); with
    `preprocessor`, one for chat published on `llm.in` (what `sy replay` sends)."""
    policy = tmp / "tenants.yaml"
    policy.write_text(yaml.safe_dump({"default": {"itpm": 10_000_000, "otpm": 1_000_000}}))
    keys = write_keys(tmp / "keys.yaml", {"sk-trace": {"tenant": "acme"}})
    await provision_pool(bus.js, pool)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(
            worker_in_process(nats_url, pool=pool, engine="sim", assignment="kv",
                              worker_id=f"{pool}-w0", heartbeat_interval=0.3)
        )  # fmt: skip
        await stack.enter_async_context(
            router_in_process(nats_url, partitions=4, pools=[pool], tenant_policy=policy,
                              rebalance_interval=0.2)
        )  # fmt: skip
        if preprocessor:
            await stack.enter_async_context(preprocessor_in_process(nats_url, chat_pool=pool))
        url = await stack.enter_async_context(
            edge_in_process(nats_url, api_keys_file=keys, chat_pool=pool)
        )
        await wait_for_pool(bus.js, pool)
        yield url


async def test_a_chat_request_is_traced_hop_by_hop(
    bus: Bus, nats_url: str, tmp_path: Path, unique: str
) -> None:
    pool = f"tr{unique}"
    async with (
        sim_fleet_with_edge(bus, nats_url, tmp_path, pool) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        resp = await http.post(
                "/v1/chat/completions",
                json={"model": "default", "messages": [{"role": "user", "content": "Hi."}],
                      "max_tokens": 8},
                headers={"Authorization": "Bearer sk-trace", "traceparent": CLIENT_TRACE},
            )  # fmt: skip
        assert resp.status_code == 200, resp.text
        # The client's trace continues in ours, and the edge says so.
        assert resp.headers["traceparent"] == CLIENT_TRACE
        request_id = resp.headers["x-request-id"]

        # A malformed header is not an error: the request gets a trace of its own.
        bad = await http.post(
                "/v1/chat/completions",
                json={"model": "default", "messages": [{"role": "user", "content": "Hi."}],
                      "max_tokens": 4},
                headers={"Authorization": "Bearer sk-trace", "traceparent": "00-nope"},
            )  # fmt: skip
        assert bad.status_code == 200
        assert trace_id(bad.headers["traceparent"]) not in (None, trace_id(CLIENT_TRACE))

    trace = await find(bus.js, request_id, window=60)
    assert trace.trace_id == trace_id(CLIENT_TRACE)
    assert trace.tenant == "acme" and trace.kind == "llm.chat" and trace.status == "ok"
    names = [h.name for h in trace.ordered()]
    assert names == PATH, names
    stored = next(h for h in trace.hops if h.name == "stored")
    assert (stored.where, stored.detail) == ("INGRESS", "llm.edge.acme")  # no preprocessor
    steps = trace.steps()
    assert all(delta >= 0 for _, delta in steps)
    total = sum(delta for _, delta in steps)
    assert total == pytest.approx(trace.end_to_end, abs=1e-9)
    assert trace.end_to_end == pytest.approx(trace.ordered()[-1].at - trace.ordered()[0].at)
    assert 0 < trace.end_to_end < 30
    dispatched = next(h for h in trace.hops if h.name == "dispatched")
    assert dispatched.detail.startswith(f"{pool}.p") and dispatched.detail.endswith(f"{pool}-w0")
    started = next(h for h in trace.hops if h.name == "started")
    assert started.where == f"{pool}-w0"

    # Every message of the request carried the same trace: the result in RES too.
    sub = await bus.js.subscribe("res.llm.acme", ordered_consumer=True)
    try:
        seen = None
        while seen is None:
            msg = await sub.next_msg(timeout=5)
            result = decode(msg.data, GenerateResult)
            if result.request_id == request_id:
                seen = result
    finally:
        await sub.unsubscribe()
    assert trace_id(seen.trace) == trace_id(CLIENT_TRACE)
    assert seen.route is not None and seen.route.routed_to == f"{pool}-w0"

    # The CLI prints the same path, and JSON whose hops add up to the end-to-end time.
    out = await asyncio.to_thread(
        CliRunner().invoke, app, ["trace", request_id, "--json", "--nats", nats_url,
                                  "--window", "60"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    shown = json.loads(out.output)
    assert [h["name"] for h in shown["hops"]] == PATH
    assert sum(h["since_previous"] for h in shown["hops"]) == pytest.approx(shown["end_to_end"])


async def test_an_edge_chat_replays_from_its_ingress_record(
    bus: Bus, nats_url: str, tmp_path: Path, unique: str
) -> None:
    """The edge runs its chat from REQ (a work queue: gone once routed) and keeps the
    `ChatRequest` on INGRESS (`llm.edge.<t>`), which nothing consumes: `sy replay` finds it
    there and sends it on `llm.in.<t>`, where it runs again and answers the same."""
    pool = f"rp{unique}"
    async with (
        sim_fleet_with_edge(bus, nats_url, tmp_path, pool, preprocessor=True) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        resp = await http.post(
            "/v1/chat/completions",
            json={"model": "default", "messages": [{"role": "user", "content": "Replay me."}],
                  "max_tokens": 8, "temperature": 0, "seed": 7},
            headers={"Authorization": "Bearer sk-trace"},
        )  # fmt: skip
        assert resp.status_code == 200, resp.text
        rid = resp.headers["x-request-id"]
        await wait_for_result(bus, rid)  # RES holds it before `sy replay` compares with it

        def sy(*args: str) -> dict[str, Any]:
            """The command's JSON line (stdout; the runner mixes in stderr's lines)."""
            out = CliRunner().invoke(app, [*args, "--nats", nats_url])
            assert out.exit_code == 0, out.output
            (line,) = [x for x in out.output.splitlines() if x.startswith("{")]
            return dict(json.loads(line))

        viewed = await asyncio.to_thread(sy, "replay", "--view", "--json", "--request-id", rid)
        assert viewed["subject"] == "llm.edge.acme", viewed
        assert viewed["message"]["id"] == rid, viewed
        diff = await asyncio.to_thread(sy, "replay", "--live", "--json", "--request-id", rid)
    assert (diff["requests"], diff["answered"], diff["identical"]) == (1, 1, True), diff
    assert diff["outputs"] == {"compared": 1, "same": 1}, diff


async def wait_for_result(bus: Bus, request_id: str, timeout: float = 10.0) -> None:
    sub = await bus.js.subscribe("res.llm.acme", ordered_consumer=True)
    try:
        async with asyncio.timeout(timeout):
            while (
                decode((await sub.next_msg(timeout)).data, GenerateResult).request_id != request_id
            ):
                pass
    finally:
        await sub.unsubscribe()


async def test_trace_of_an_unknown_or_malformed_id_says_so(bus: Bus, nats_url: str) -> None:
    with pytest.raises(SwitchyardError, match="nothing about request"):
        await find(bus.js, new_id(), window=1)
    out = await asyncio.to_thread(
        CliRunner().invoke, app, ["trace", "not-an-id!", "--nats", nats_url]
    )
    assert out.exit_code == 1 and "not a Switchyard request id" in out.output
