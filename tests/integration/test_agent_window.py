"""The `window` layout on real NATS: the preprocessor builds a session's window across
steps from KV `agent_windows`, compacts it every W frames, and restarts it when the
store lacks a frame, without failing a step.

One preprocessor (window layout, W = 3, no in-memory cache, so every earlier frame
is read back from KV) with a second tenant on `single`. The test reads the requests
it publishes on `req.agent.<tenant>` (no router runs: nothing consumes them, and
the test purges them at the end).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from nats.aio.subscription import Subscription
from nats.js.errors import NotFoundError

from services.preprocessor.agent import limits_from
from services.preprocessor.images import PreparedFrame, prepare_frame
from services.preprocessor.settings import PreprocessorSettings
from services.preprocessor.window import WindowStore, assemble, to_entry
from switchyard import subjects
from switchyard.bus.connection import Bus, connect
from switchyard.bus.publish import publish
from switchyard.bus.topology import WINDOWS_BUCKET
from switchyard.codec import decode
from switchyard.config import Settings
from switchyard.engines.base import EngineRequest
from switchyard.engines.sim import SimSettings
from switchyard.engines.sim_tokens import render_prompt
from switchyard.ids import new_id
from switchyard.messages.agent import AgentStep
from switchyard.messages.agentwindow import WindowFrame, window_key
from switchyard.messages.inference import GenerateRequest, ImagePart, TextPart
from tests.integration.test_agent_path import gif_frame, make_step, png_frame
from tests.support.fleet import preprocessor_in_process, provision_pool

W = 3


@dataclass(frozen=True)
class Pre:
    bus: Bus
    pool: str
    tenant: str  # window layout (the pool's)
    single: str  # a tenant on the single layout


@pytest.fixture(scope="module")
async def pre(nats_url: str) -> AsyncIterator[Pre]:
    tag = new_id().lower()[-8:]
    pool, tenant, single = f"win{tag}", f"win{tag}", f"one{tag}"
    bus = await connect(Settings(nats_url=nats_url), "pytest-agent-window")
    await provision_pool(bus.js, pool)
    try:
        async with preprocessor_in_process(
            nats_url, agent_pool=pool, frame_procs=0, agent_layout="window", agent_window=W,
            agent_window_cache_mb=0, agent_tenant_layouts={single: {"layout": "single"}},
        ):  # fmt: skip
            yield Pre(bus, pool, tenant, single)
    finally:
        for t in (tenant, single):
            with contextlib.suppress(Exception):
                await bus.js.purge_stream("REQ", subject=subjects.req("agent", t))
        await bus.close()


def with_tenant(step: AgentStep, tenant: str) -> AgentStep:
    return step.model_copy(update={"tenant": tenant})


async def laid_out(pre: Pre, sub: Subscription, step: AgentStep) -> GenerateRequest:
    """Send `step` and return the request the preprocessor made of it."""
    await publish(pre.bus.js, subjects.agent_in(step.tenant), step, msg_id=step.id)
    while True:
        req = decode((await sub.next_msg(timeout=60)).data, GenerateRequest)
        if req.id == step.id:
            return req


def image_hashes(req: GenerateRequest) -> list[str]:
    assert req.messages is not None
    parts = req.messages[-1].content
    assert isinstance(parts, list)
    hashes = [p.hash for p in parts if isinstance(p, ImagePart)]
    assert hashes == [img.hash for img in req.images]  # every laid-out frame is carried
    return hashes


def tokens(req: GenerateRequest) -> list[str]:
    return render_prompt(EngineRequest.from_generate(req), SimSettings())


async def stored(pre: Pre, session: str, step: int) -> WindowFrame | None:
    kv = await pre.bus.js.key_value(WINDOWS_BUCKET)
    try:
        entry = await kv.get(window_key(pre.pool, pre.tenant, session, step))
    except NotFoundError:
        return None
    assert entry.value is not None
    return decode(entry.value, WindowFrame)


async def test_window_grows_from_the_store_compacts_and_restarts_when_frames_are_lost(
    pre: Pre,
) -> None:
    session = f"ep-{new_id()[-8:]}"
    sub = await pre.bus.nc.subscribe(subjects.req("agent", pre.tenant))
    current: dict[int, str] = {}  # step -> its own frame's hash
    history: list[str] = []
    reqs: dict[int, GenerateRequest] = {}

    async def step(k: int) -> list[str]:
        # Like any phone: the previous and the current frame, the whole history.
        frames = [png_frame(k - 1), png_frame(k)] if k else [png_frame(k)]
        s = make_step(frames, session=session, step=k, history=history[:k])
        req = await laid_out(pre, sub, with_tenant(s, pre.tenant))
        reqs[k] = req
        current[k] = req.images[-1].hash
        return image_hashes(req)

    try:
        history[:] = [f'{{"type":"wait","ms":{100 + k}}}' for k in range(12)]
        assert await step(0) == [current[0]]
        assert await step(1) == [current[0], current[1]]
        assert await step(2) == [current[0], current[1], current[2]]
        # Within the window, step 2's prompt is step 1's without its query, then
        # action 1, frame 2 and the query: a prefix cache serves all of step 1.
        t1, t2 = tokens(reqs[1]), tokens(reqs[2])
        query = t1.index("Step", t1.index(f"<img:{current[1]}:0>"))
        assert t2[:query] == t1[:query]
        assert reqs[2].prompt_tokens > reqs[1].prompt_tokens > reqs[0].prompt_tokens
        assert reqs[2].messages is not None
        parts = reqs[2].messages[-1].content
        assert isinstance(parts, list)
        texts = [p.text for p in parts if isinstance(p, TextPart)]
        assert texts[1:3] == [f"0: {history[0]}\n", f"1: {history[1]}\n"]

        # W frames held: step 3 compacts; the old window's entries are deleted.
        assert await step(3) == [current[3]]
        assert [await stored(pre, session, s) for s in range(3)] == [None, None, None]
        entry = await stored(pre, session, 3)
        assert entry is not None and entry.start == 3 and entry.image.hash == current[3]
        assert await step(4) == [current[3], current[4]]

        # The store loses step 4's frame (TTL, a failed write): step 5 restarts its
        # window instead of failing, and the next step continues the new one.
        kv = await pre.bus.js.key_value(WINDOWS_BUCKET)
        await kv.delete(window_key(pre.pool, pre.tenant, session, 4))
        assert await step(5) == [current[5]]
        assert await step(6) == [current[5], current[6]]
        # Steps not consecutive (7 never came): step 8 restarts too.
        assert await step(8) == [current[8]]
        assert reqs[8].messages is not None
        assert f"7: {history[7]}" in str(reqs[8].messages[-1].content)  # actions stay text
    finally:
        await sub.unsubscribe()


async def test_a_tenant_on_single_gets_its_current_frame_only_never_decoding_the_previous(
    pre: Pre,
) -> None:
    sub = await pre.bus.nc.subscribe(subjects.req("agent", pre.single))
    try:
        session = f"ep-{new_id()[-8:]}"
        # A previous frame `pair` would refuse (GIF): `single` never decodes it.
        s = make_step([gif_frame(), png_frame(1)], session=session, step=1, history=["back"])
        req = await laid_out(pre, sub, with_tenant(s, pre.single))
        assert len(image_hashes(req)) == 1
        assert req.messages is not None and "the current screenshot" in str(req.messages[0])
    finally:
        await sub.unsubscribe()


async def test_a_window_too_big_for_one_message_restarts_instead_of_failing(pre: Pre) -> None:
    """`assemble` on the real store: the same window fits a large budget, not a small one."""
    session = f"ep-{new_id()[-8:]}"
    limits = limits_from(PreprocessorSettings())
    frames = [prepare_frame(png_frame(k), limits) for k in range(3)]
    assert all(isinstance(f, PreparedFrame) for f in frames)
    prepared = [f for f in frames if isinstance(f, PreparedFrame)]
    store = WindowStore(pre.bus.js, pre.pool, cache_bytes=0)
    await store.open()
    steps = [
        with_tenant(make_step([png_frame(k)], session=session, step=k), pre.tenant)
        for k in range(3)
    ]
    for k in range(2):
        await store.put(pre.tenant, session, to_entry(steps[k], 0, prepared[k]))
    size = sum(len(f.data) for f in prepared)
    roomy = await assemble(store, steps[2], prepared[2], W, budget=size + (1 << 20))
    assert roomy.outcome == "continued" and [f.hash for f in roomy.frames] == [
        f.hash for f in prepared
    ]
    tight = await assemble(store, steps[2], prepared[2], W, budget=size)
    assert tight.outcome == "oversized" and tight.start == 2
    assert [f.hash for f in tight.frames] == [prepared[2].hash] and tight.ended == range(0, 2)
