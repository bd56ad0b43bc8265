"""The worker on real NATS with the real llama.cpp engine (SmolLM2-135M on CPU)."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest

from switchyard import subjects
from switchyard.bus.connection import Bus
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.codec import encode
from switchyard.messages.inference import (
    Cancel,
    ChatMessage,
    GenerateRequest,
    GrammarConstraint,
    JsonSchemaConstraint,
    Sampling,
)
from tests.support.fleet import ask, heartbeat, provision_pool, work_subject, worker_in_process
from tests.support.poll import until

ACTION_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"enum": ["click", "back"]},
        "x": {"type": "integer", "minimum": 0, "maximum": 1280},
        "y": {"type": "integer", "minimum": 0, "maximum": 720},
    },
    "required": ["type", "x", "y"],
    "additionalProperties": False,
}


def chat(pool: str, text: str, **kw: object) -> GenerateRequest:
    return GenerateRequest(
        tenant="acme",
        workload="llm",
        pool=pool,
        messages=[ChatMessage(role="user", content=text)],
        **kw,  # type: ignore[arg-type]
    )


async def one_runs_one_waits(bus: Bus, worker: str) -> bool:
    """Whether `worker`'s heartbeat shows a request running and another waiting for it."""
    beat = await heartbeat(bus.js, worker)
    return beat is not None and beat.running >= 1 and beat.waiting + beat.queued >= 1


@pytest.fixture
async def pool(bus: Bus, unique: str) -> str:
    name = f"w{unique}"
    await provision_pool(bus.js, name)
    return name


async def test_chat_streams_in_order_and_ends_with_usage(
    bus: Bus, pool: str, nats_url: str
) -> None:
    async with worker_in_process(nats_url, pool=pool, engine="llamacpp"):
        frames = await ask(bus, chat(pool, "Name three colours.", sampling=Sampling(max_tokens=24)))
    assert [f.seq for f in frames] == list(range(len(frames)))
    deltas, end = frames[:-1], frames[-1]
    assert len(deltas) >= 2 and end.type == "end" and end.result is not None
    assert end.result.status == "ok" and end.result.text == "".join(d.text for d in deltas)
    usage = end.result.usage
    assert usage.prompt_tokens > 5 and 1 <= usage.completion_tokens <= 24
    assert end.result.timings.ttft is not None and end.result.timings.total > 0


async def test_json_schema_grammar_and_reproducibility(bus: Bus, pool: str, nats_url: str) -> None:
    async with worker_in_process(nats_url, pool=pool, engine="llamacpp"):
        req = chat(
            pool, "Tap the start button at (640, 360). Answer with one action as JSON.",
            sampling=Sampling(max_tokens=40, temperature=0.0, seed=11),
            constraint=JsonSchemaConstraint(json_schema=ACTION_SCHEMA),
        )  # fmt: skip
        first = (await ask(bus, req))[-1].result
        again = (await ask(bus, req.model_copy(update={"id": req.id + "b"})))[-1].result
        yes_no = chat(
            pool, "Is the sky blue?", sampling=Sampling(max_tokens=8),
            constraint=GrammarConstraint(gbnf='root ::= ("yes" | "no")'),
        )  # fmt: skip
        gbnf = (await ask(bus, yes_no))[-1].result
    assert first and again and gbnf
    jsonschema.validate(json.loads(first.text), ACTION_SCHEMA)
    assert again.text == first.text  # temperature 0 + seed
    assert gbnf.text in {"yes", "no"}


async def test_cancel_mid_generation_stops_within_a_second(
    bus: Bus, pool: str, nats_url: str
) -> None:
    async with worker_in_process(nats_url, pool=pool, engine="llamacpp"):
        req = chat(pool, "Write a very long story about a dragon.",
                   sampling=Sampling(max_tokens=1500))  # fmt: skip
        async with TokenStreamReader(bus.nc, idle_timeout=30) as reader:
            await publish(bus.js, work_subject(req), req.model_copy(update={"reply": reader.inbox}))
            frames = []
            cancelled_at = 0.0
            async for frame in reader:
                frames.append(frame)
                if len(frames) == 3:
                    cancelled_at = time.monotonic()
                    await bus.nc.publish(
                        subjects.cancel(req.id), encode(Cancel(tenant="acme", request_id=req.id))
                    )
            stopped_after = time.monotonic() - cancelled_at
    end = frames[-1]
    assert end.type == "end" and end.result and end.result.status == "cancelled"
    assert end.result.usage.completion_tokens < 1500
    assert stopped_after < 1.0


async def test_cancel_of_a_queued_request_removes_it(bus: Bus, pool: str, nats_url: str) -> None:
    async with worker_in_process(
        nats_url, pool=pool, engine="llamacpp", engine_instances=1
    ) as settings:
        long = chat(pool, "Count to one thousand.", sampling=Sampling(max_tokens=300))
        queued = chat(pool, "Say hi.", sampling=Sampling(max_tokens=300), session=None)
        async with (
            TokenStreamReader(bus.nc, idle_timeout=60) as r1,
            TokenStreamReader(bus.nc, idle_timeout=60) as r2,
        ):
            # Same tenant key -> same partition -> the second waits behind the first.
            await publish(bus.js, work_subject(long), long.model_copy(update={"reply": r1.inbox}))
            await publish(
                bus.js, work_subject(queued), queued.model_copy(update={"reply": r2.inbox})
            )
            await until(lambda: one_runs_one_waits(bus, settings.worker_id), timeout=60,
                        what="the first request running, the second waiting")  # fmt: skip
            await bus.nc.publish(subjects.cancel(queued.id), b"")
            await bus.nc.publish(subjects.cancel(long.id), b"")
            second = [f async for f in r2]
            first = [f async for f in r1]
    assert second[-1].result and second[-1].result.status == "cancelled"
    assert second[-1].result.usage.completion_tokens == 0
    assert first[-1].result and first[-1].result.status == "cancelled"


async def test_bad_requests_get_clear_errors_and_the_worker_keeps_running(
    bus: Bus, pool: str, nats_url: str
) -> None:
    async with worker_in_process(nats_url, pool=pool, engine="llamacpp"):
        too_long = chat(pool, "word " * 5000, sampling=Sampling(max_tokens=16))
        bad_schema = chat(pool, "x", constraint=JsonSchemaConstraint(json_schema={"type": 12}))
        bad_grammar = chat(pool, "x", constraint=GrammarConstraint(gbnf="root ::= ( unclosed"))
        expired = chat(pool, "x", deadline=time.time() - 1)
        stale = chat(pool, "x", frame_ts=time.time() - 10, stale_after=2.0)
        answers = {}
        cases = {
            "too_long": too_long,
            "bad_schema": bad_schema,
            "bad_grammar": bad_grammar,
            "expired": expired,
            "stale": stale,
        }
        for name, req in cases.items():
            answers[name] = (await ask(bus, req, timeout=30))[-1]
        healthy = (await ask(bus, chat(pool, "Say ok.", sampling=Sampling(max_tokens=4))))[-1]
    assert answers["too_long"].type == "error" and answers["too_long"].error
    assert answers["too_long"].error.code == "context_length"
    for name in ("bad_schema", "bad_grammar"):
        assert answers[name].type == "error" and answers[name].error
        assert answers[name].error.code == "invalid_request" and answers[name].error.reason
    assert answers["expired"].result and answers["expired"].result.status == "expired"
    stale_result = answers["stale"].result
    assert stale_result and stale_result.status == "stale" and stale_result.error
    assert "old" in stale_result.error.reason
    assert healthy.result and healthy.result.status == "ok"
