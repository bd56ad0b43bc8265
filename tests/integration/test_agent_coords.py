"""Agent answers carry coordinates in the original frame's pixels, on the real path.

agent.in (or the edge's `/v1/agent/step`) -> preprocessor (resizes 1280x720 to the
model's 308x168) -> router -> `sim` worker -> the answer. The model answers in the
resized frame it saw; the worker maps the answer back with the geometry the
preprocessor recorded. The reference is the same prompt sent without that
geometry: the sim engine decodes greedily from the prompt alone, so that gives
the model's raw answer, and the served answer must be exactly its mapping.
"""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from PIL import Image, ImageDraw

from services.preprocessor.agent import limits_from, to_generate
from services.preprocessor.images import PreparedFrame, prepare_frame
from services.preprocessor.settings import PreprocessorSettings
from switchyard.agentprompt import Geometry, answer_to_original
from switchyard.bus.connection import Bus, connect
from switchyard.config import Settings
from switchyard.ids import new_id
from switchyard.messages.agent import AgentStep, RawFrame, StepOptions, parse_answer
from tests.integration.test_agent_path import final, send
from tests.support.edge import agent_fleet_with_edge, write_keys
from tests.support.fleet import submit

ORIGINAL = (1280, 720)
MAX_PIXELS = 320 * 180  # the model sees 308x168: a scale of ~4.2 on each side
KEY = "sk-coords"
TENANT = "coords"
STEPS = 8  # enough steps that some answers are clicks, long presses or swipes


@dataclass(frozen=True)
class Fleet:
    bus: Bus
    pool: str
    edge: str
    pre: PreprocessorSettings


@pytest.fixture(scope="module")
async def fleet(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    pool = f"co{new_id().lower()[-8:]}"
    keys = write_keys(tmp_path_factory.mktemp("coords") / "keys.yaml", {KEY: {"tenant": TENANT}})
    pre = PreprocessorSettings(nats_url=nats_url, agent_pool=pool, max_pixels=MAX_PIXELS)
    bus = await connect(Settings(nats_url=nats_url), "pytest-agent-coords")
    try:
        async with agent_fleet_with_edge(nats_url, pool, keys, engine="sim",
                                         preprocessor={"max_pixels": MAX_PIXELS},
                                         edge={}) as url:  # fmt: skip
            yield Fleet(bus, pool, url, pre)
    finally:
        await bus.close()


def frame(step: int) -> bytes:
    w, h = ORIGINAL
    img = Image.new("RGB", ORIGINAL, (30, 80, 150))
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, w, h // 12), fill=(20, 20, 30))
    draw.text((10, 5), f"SCORE {step * 130}", fill=(250, 220, 80))
    draw.rounded_rectangle(
        (200 + 40 * step, 300, 360 + 40 * step, 360), radius=8, fill=(240, 160, 40)
    )
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def make_step(k: int, session: str) -> AgentStep:
    return AgentStep(
        tenant=TENANT, session=session, step=k, frame_ts=time.time(), stale_after=120.0,
        frames=[RawFrame(data=frame(k), mime="image/png")], goal="collect the daily reward",
        history=[f"{{\"type\":\"wait\",\"ms\":{100 * j + 1}}}" for j in range(k)],
        options=StepOptions(max_tokens=48),  # a sim click is ~23 pseudo-tokens: never truncated
    )  # fmt: skip


async def raw_answer(f: Fleet, step: AgentStep) -> tuple[str, Geometry]:
    """The model's own answer to `step` (resized space) and the frame's geometry."""
    prepared = prepare_frame(step.frames[-1].data, limits_from(f.pre))
    assert isinstance(prepared, PreparedFrame)
    req = to_generate(step, [prepared], f.pre)
    assert req.frame_geometry is not None
    unmapped = req.model_copy(update={"id": new_id(), "frame_geometry": None, "reply": None})
    res = final(await submit(f.bus, unmapped))
    assert res.status == "ok", res.error
    return res.text, Geometry.of(req.frame_geometry)


def points(text: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a in parse_answer(text):
        d = a.model_dump()
        out += [(d[x], d[y]) for x, y in (("x", "y"), ("x1", "y1"), ("x2", "y2")) if x in d]
    return out


async def test_nats_answers_are_mapped_to_the_original_frame(fleet: Fleet) -> None:
    session = f"ep-{new_id()[-8:]}"
    seen = changed = 0
    for k in range(STEPS):
        step = make_step(k, session)
        res = final(await send(fleet.bus, step))
        assert res.status == "ok", res.error
        raw, geometry = await raw_answer(fleet, step)
        assert (geometry.width, geometry.height) == (308, 168)
        assert res.text == answer_to_original(raw, geometry)
        for x, y in points(res.text):
            assert 0 <= x < ORIGINAL[0] and 0 <= y < ORIGINAL[1]
        seen += len(points(res.text))
        changed += res.text != raw
    assert seen > 0 and changed > 0, "no answer carried coordinates; use more steps"


async def test_edge_answers_are_mapped_to_the_original_frame(fleet: Fleet) -> None:
    session = f"ep-{new_id()[-8:]}"
    seen = 0
    async with httpx.AsyncClient(base_url=fleet.edge, timeout=60) as http:
        for k in range(STEPS):
            step = make_step(k, session)
            body = {
                "frames": [{"data": base64.b64encode(step.frames[0].data).decode(),
                            "mime": "image/png"}],
                "session": session, "frame_ts": step.frame_ts, "stale_after": 120.0, "step": k,
                "goal": step.goal, "history": step.history, "options": {"max_tokens": 48},
            }  # fmt: skip
            resp = await http.post(
                "/v1/agent/step", json=body, headers={"Authorization": f"Bearer {KEY}"}
            )
            assert resp.status_code == 200, resp.text
            raw, geometry = await raw_answer(fleet, step)
            expected = json.loads(answer_to_original(raw, geometry))
            assert resp.json()["answer"] == expected
            seen += len(points(json.dumps(expected)))
    assert seen > 0, "no answer carried coordinates; use more steps"
