"""Agent steps through the fleet on real NATS.

agent.in -> preprocessor (decode, resize, hash, layout) -> REQ -> router -> WORK
-> worker (llama.cpp, SmolLM2 on the CPU) -> the action on the step's reply inbox.

One fleet (router, two `llamacpp` workers, the preprocessor) serves the whole
module, so the model is loaded once per worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import struct
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import msgpack
import pytest
from PIL import Image, ImageDraw

from switchyard import subjects
from switchyard.agentactions import parse_actions
from switchyard.bus.connection import Bus, connect
from switchyard.bus.publish import publish
from switchyard.bus.tokenstream import TokenStreamReader
from switchyard.config import Settings
from switchyard.ids import new_id
from switchyard.messages.agent import ActionFormat, AgentStep, RawFrame, StepOptions, answer_schema
from switchyard.messages.inference import ErrorInfo, GenerateResult, TokenFrame
from tests.support.fleet import (
    preprocessor_in_process,
    provision_pool,
    router_in_process,
    wait_for_pool,
    worker_in_process,
)

TENANT = "phones"
MAX_FRAME_BYTES = 256 * 1024  # the preprocessor's byte cap in this module
MAX_TOKENS = 24


@dataclass(frozen=True)
class Fleet:
    bus: Bus
    pool: str
    workers: tuple[str, ...]


@pytest.fixture(scope="module")
async def fleet(nats_url: str) -> AsyncIterator[Fleet]:
    pool = f"a{new_id().lower()[-10:]}"
    workers = (f"{pool}-w0", f"{pool}-w1")
    bus = await connect(Settings(nats_url=nats_url), "pytest-agent")
    await provision_pool(bus.js, pool)
    try:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(
                router_in_process(nats_url, partitions=4, pools=[pool], rebalance_interval=0.2)
            )
            for wid in workers:
                await stack.enter_async_context(
                    worker_in_process(nats_url, pool=pool, engine="llamacpp", assignment="kv",
                                      worker_id=wid, heartbeat_interval=0.3)
                )  # fmt: skip
            await stack.enter_async_context(
                preprocessor_in_process(
                    nats_url, agent_pool=pool, frame_procs=0, max_frame_bytes=MAX_FRAME_BYTES
                )
            )
            await wait_for_pool(bus.js, pool, workers=len(workers))
            yield Fleet(bus, pool, workers)
    finally:
        await bus.close()


def png_frame(step: int, size: tuple[int, int] = (640, 360)) -> bytes:
    """A game-like screen as a real PNG: a score bar and a couple of buttons."""
    w, h = size
    img = Image.new("RGB", size, (40, 90, 160))
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, w, h // 12), fill=(20, 20, 30))
    draw.text((10, 5), f"SCORE {step * 130}", fill=(250, 220, 80))
    for i in range(3):
        x, y = 40 + i * 180 + step * 7, h // 2 + (i - 1) * 40
        draw.rounded_rectangle((x, y, x + 120, y + 40), radius=8, fill=(240, 160 - 30 * i, 40))
        draw.text((x + 10, y + 14), ("PLAY", "SHOP", "X")[i], fill=0)
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_with_header(width: int, height: int) -> bytes:
    """A well-formed PNG whose IHDR claims `width` x `height` (with a tiny, bogus IDAT)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    sig = b"\x89PNG\r\n\x1a\n"
    return sig + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def gif_frame() -> bytes:
    out = io.BytesIO()
    Image.new("P", (64, 64), 3).save(out, format="GIF")
    return out.getvalue()


def make_step(
    frames: list[bytes], *, session: str, step: int = 0, history: list[str] | None = None,
    frame_ts: float | None = None, stale_after: float = 120.0, fmt: ActionFormat = "json",
) -> AgentStep:  # fmt: skip
    return AgentStep(
        tenant=TENANT, session=session, step=step, history=history or [],
        frame_ts=time.time() if frame_ts is None else frame_ts, stale_after=stale_after,
        frames=[RawFrame(data=f, mime="image/png") for f in frames],
        goal="collect the daily reward",
        options=StepOptions(max_tokens=MAX_TOKENS, action_format=fmt),
    )  # fmt: skip


async def send(bus: Bus, step: AgentStep, timeout: float = 60.0) -> list[TokenFrame]:
    async with TokenStreamReader(bus.nc, idle_timeout=timeout) as reader:
        sent = step.model_copy(update={"reply": reader.inbox})
        await publish(bus.js, subjects.agent_in(step.tenant), sent, msg_id=step.id)
        return [f async for f in reader]


async def send_raw(bus: Bus, fields: dict[str, Any], timeout: float = 30.0) -> list[TokenFrame]:
    """Publish a step that a client-side validator would refuse (e.g. an empty frame)."""
    async with TokenStreamReader(bus.nc, idle_timeout=timeout) as reader:
        data = msgpack.packb({**fields, "reply": reader.inbox}, use_bin_type=True)
        await bus.js.publish(subjects.agent_in(TENANT), data, headers={"Nats-Msg-Id": fields["id"]})
        return [f async for f in reader]


def final(frames: list[TokenFrame]) -> GenerateResult:
    assert frames, "no answer on the reply inbox"
    last = frames[-1]
    assert last.type == "end" and last.result is not None, last
    return last.result


def refusal(frames: list[TokenFrame]) -> ErrorInfo:
    """A refused step ends its stream with one typed `error` frame."""
    assert len(frames) == 1, frames
    assert frames[0].type == "error" and frames[0].error is not None, frames[0]
    return frames[0].error


def assert_valid_action(res: GenerateResult, step: AgentStep) -> None:
    assert res.status == "ok", res.error
    assert res.request_id == step.id
    assert res.frame_ts == pytest.approx(step.frame_ts)  # the client can refuse an old action
    fmt = step.options.action_format
    if fmt == "json":
        jsonschema.validate(json.loads(res.text), answer_schema())
    # The worker's output step typed the answer it wrote (both in the phone's pixels).
    assert res.actions is not None and len(res.actions) == 1 and res.thought is None
    assert res.actions == parse_actions(res.text, fmt)


async def test_png_step_returns_a_schema_valid_action(fleet: Fleet) -> None:
    step = make_step([png_frame(0)], session=f"ep-{new_id()[-8:]}")
    res = final(await send(fleet.bus, step))
    assert_valid_action(res, step)
    assert res.worker in fleet.workers
    assert res.usage.prompt_tokens > 0 and 1 <= res.usage.completion_tokens <= MAX_TOKENS


async def test_later_steps_of_an_episode_reuse_the_prefix_on_the_same_worker(
    fleet: Fleet,
) -> None:
    session = f"ep-{new_id()[-8:]}"
    f0, f1 = png_frame(1), png_frame(2)
    first = make_step([f0], session=session, step=0)
    r0 = final(await send(fleet.bus, first))
    assert_valid_action(r0, first)

    second = make_step([f0, f1], session=session, step=1, history=[r0.text])
    r1 = final(await send(fleet.bus, second))
    assert_valid_action(r1, second)
    assert r1.worker == r0.worker  # session affinity: the prefix is where the KV is
    assert r1.usage.cached_tokens > 0, r1.usage
    assert r1.usage.cached_tokens < r1.usage.prompt_tokens  # the current frame is new

    # The system prompt alone would be reused across episodes too; what is the
    # episode's own is the history, which only grows at its end: step 2 reuses
    # step 1's history line as well, so its cached prefix is strictly longer.
    third = make_step([f1, png_frame(3)], session=session, step=2, history=[r0.text, r1.text])
    r2 = final(await send(fleet.bus, third))
    assert_valid_action(r2, third)
    assert r2.worker == r0.worker
    assert r2.usage.cached_tokens > r1.usage.cached_tokens, (r1.usage, r2.usage)


HOSTILE = {
    "bomb": (png_with_header(100_000, 100_000), "oversized"),
    "truncated": (png_frame(3)[:700], "truncated"),
    "gif": (gif_frame(), "invalid_request"),
    "text": (b"hello, I am not an image at all\n" * 4, "invalid_request"),
    "zero_size": (png_with_header(0, 0), "invalid_request"),
    "over_byte_cap": (b"\x89PNG\r\n\x1a\n" + b"\x00" * (MAX_FRAME_BYTES + 1), "oversized"),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
async def test_hostile_frame_gets_a_typed_error_and_the_service_keeps_running(
    fleet: Fleet, kind: str
) -> None:
    data, code = HOSTILE[kind]
    step = make_step([png_frame(4), data], session=f"ep-{new_id()[-8:]}", step=1)
    error = refusal(await send(fleet.bus, step, timeout=30))
    assert error.code == code, error


async def test_empty_frame_gets_a_typed_error(fleet: Fleet) -> None:
    fields = make_step([png_frame(5)], session=f"ep-{new_id()[-8:]}").model_dump()
    fields["frames"] = [{"data": b"", "mime": "image/png"}]
    error = refusal(await send_raw(fleet.bus, fields))
    assert error.code == "schema", error  # typed: the step fails its contract


async def test_normal_step_after_hostile_ones_still_succeeds(fleet: Fleet) -> None:
    bus = fleet.bus
    hostile = [make_step([d], session=f"h-{k}-{new_id()[-6:]}") for k, (d, _) in HOSTILE.items()]
    answers = await asyncio.gather(*(send(bus, s, timeout=30) for s in hostile))
    assert [refusal(a).code for a in answers] == [code for _, code in HOSTILE.values()]
    step = make_step([png_frame(6)], session=f"ep-{new_id()[-8:]}")
    assert_valid_action(final(await send(bus, step)), step)


async def test_stale_step_is_answered_stale_and_never_reaches_a_worker(fleet: Fleet) -> None:
    old = time.time() - 3600
    step = make_step([png_frame(7)], session=f"ep-{new_id()[-8:]}", frame_ts=old, stale_after=1.0)
    res = final(await send(fleet.bus, step, timeout=30))
    assert res.status == "stale", res
    assert res.error is not None and res.error.code == "stale"
    assert res.worker is None
    assert res.frame_ts == pytest.approx(old)
    assert res.usage.prompt_tokens == 0 and res.text == ""
