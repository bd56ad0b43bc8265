"""Agent answers carry coordinates in the original frame's pixels, on the real path.

agent.in (or the edge's `/v1/agent/step`) -> preprocessor (resizes 1280x720 to the
model's 308x168) -> router -> `sim` worker -> the answer. The model answers in the
resized frame it saw; the worker maps the answer back with the geometry the
preprocessor recorded. The reference is the same prompt sent without that
geometry: the sim engine decodes greedily from the prompt alone, so that gives
the model's raw answer, and the served answer must be exactly its mapping.

Every test runs for each VLM profile (`switchyard.vlmgeometry`): a Qwen2.5-VL pool
as above, and a Qwen3-VL pool (the default) (`SY_AGENT_VLM=qwen3-vl`, its sim worker
`SY_SIM_VLM=qwen3-vl`), whose frames are resized to 32-px tokens (320x160), whose
prompt asks for relative coordinates, and whose model answers 0-1000 on each axis:
the worker maps those by the profile the request records, not by the frame's size.
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
from switchyard.agentactions import parse_actions
from switchyard.agentprompt import Geometry
from switchyard.bus.connection import Bus, connect
from switchyard.config import Settings
from switchyard.ids import new_id
from switchyard.messages.agent import ActionFormat, AgentStep, RawFrame, StepOptions
from switchyard.vlmgeometry import VLM_NAMES, VlmName
from tests.integration.test_agent_path import final, send
from tests.support.agentanswers import old_mapping
from tests.support.edge import agent_fleet_with_edge, write_keys
from tests.support.fleet import submit

ORIGINAL = (1280, 720)
MAX_PIXELS = 320 * 180  # the model sees 308x168: a scale of ~4.2 on each side
# What the model sees of a frame, per profile: whole 28-px or 32-px tokens within MAX_PIXELS.
SEEN: dict[VlmName, tuple[int, int]] = {"qwen2.5-vl": (308, 168), "qwen3-vl": (320, 160)}
KEY = "sk-coords"
TENANT = "coords"
STEPS = 8  # enough steps that some answers are clicks, long presses or swipes


@dataclass(frozen=True)
class Fleet:
    bus: Bus
    pool: str
    edge: str
    pre: PreprocessorSettings
    vlm: VlmName


# One fleet per profile, one at a time: two on the same NATS would share the services'
# durable consumers, and a step could be prepared for the other profile.
@pytest.fixture(scope="module", params=VLM_NAMES)
async def fleet(
    request: pytest.FixtureRequest, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    vlm: VlmName = request.param
    pool = f"co{new_id().lower()[-8:]}"
    keys = write_keys(tmp_path_factory.mktemp("coords") / "keys.yaml", {KEY: {"tenant": TENANT}})
    # `single`: a step's prompt holds its own frame alone, so `raw_answer` can ask the
    # model the same prompt again (a `window` prompt holds the session's earlier frames).
    pre = PreprocessorSettings(
        nats_url=nats_url, agent_pool=pool, max_pixels=MAX_PIXELS, agent_vlm=vlm,
        agent_layout="single",
    )  # fmt: skip
    bus = await connect(Settings(nats_url=nats_url), "pytest-agent-coords")
    try:
        async with agent_fleet_with_edge(
            nats_url, pool, keys, engine="sim", edge={},
            preprocessor={"max_pixels": MAX_PIXELS, "agent_vlm": vlm, "agent_layout": "single"},
            worker={"sim_vlm": vlm},
        ) as url:  # fmt: skip
            yield Fleet(bus, pool, url, pre, vlm)
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


def make_step(k: int, session: str, fmt: ActionFormat = "json") -> AgentStep:
    return AgentStep(
        tenant=TENANT, session=session, step=k, frame_ts=time.time(), stale_after=120.0,
        frames=[RawFrame(data=frame(k), mime="image/png")], goal="collect the daily reward",
        history=[f"{{\"type\":\"wait\",\"ms\":{100 * j + 1}}}" for j in range(k)],
        # A sim click is ~23 pseudo-tokens: never truncated.
        options=StepOptions(max_tokens=48, action_format=fmt),
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


def points(text: str, fmt: ActionFormat = "json") -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a in parse_actions(text, fmt):
        d = a.model_dump()
        out += [(d[x], d[y]) for x, y in (("x", "y"), ("x1", "y1"), ("x2", "y2")) if x in d]
    return out


def by_hand(x: int, y: int, vlm: VlmName) -> tuple[int, int]:
    """The original pixel a model's point names, spelled out apart from `Geometry`."""
    (w, h), (sw, sh) = ORIGINAL, SEEN[vlm]
    if vlm == "qwen3-vl":  # x/1000 of the width
        return min(w - 1, x * w // 1000), min(h - 1, y * h // 1000)
    return min(w - 1, int((x + 0.5) * w / sw)), min(h - 1, int((y + 0.5) * h / sh))


async def test_nats_answers_are_mapped_to_the_original_frame(fleet: Fleet) -> None:
    session = f"ep-{new_id()[-8:]}"
    seen = changed = 0
    raw_points: list[tuple[int, int]] = []
    for k in range(STEPS):
        fmt: ActionFormat = "compact" if k % 2 else "json"
        step = make_step(k, session, fmt)
        res = final(await send(fleet.bus, step))
        assert res.status == "ok", res.error
        raw, geometry = await raw_answer(fleet, step)
        # The profile the prompt asked for is recorded with the frame the model saw.
        assert (geometry.width, geometry.height, geometry.vlm) == (*SEEN[fleet.vlm], fleet.vlm)
        # The text the worker wrote before it parsed once, and the actions it says, typed.
        assert res.text == old_mapping(raw, geometry, fmt)
        assert res.actions is not None and res.actions == parse_actions(res.text, fmt)
        assert points(res.text, fmt) == [by_hand(x, y, fleet.vlm) for x, y in points(raw, fmt)]
        for x, y in points(res.text, fmt):
            assert 0 <= x < ORIGINAL[0] and 0 <= y < ORIGINAL[1]
        seen += len(points(res.text, fmt))
        changed += res.text != raw
        raw_points += points(raw, fmt)
    assert seen > 0 and changed > 0, "no answer carried coordinates; use more steps"
    if fleet.vlm == "qwen3-vl":  # 0-1000, not pixels of the 320x160 frame the model saw
        assert all(0 <= x <= 1000 and 0 <= y <= 1000 for x, y in raw_points)
        assert max(x for x, _ in raw_points) > 320 or max(y for _, y in raw_points) > 160


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
                "goal": step.goal, "history": step.history,
                "options": {"max_tokens": 48, "action_format": "json"},  # as `step`'s
            }  # fmt: skip
            resp = await http.post(
                "/v1/agent/step", json=body, headers={"Authorization": f"Bearer {KEY}"}
            )
            assert resp.status_code == 200, resp.text
            raw, geometry = await raw_answer(fleet, step)
            # The edge renders the worker's typed answer: what it answered before.
            out = resp.json()
            expected = json.loads(old_mapping(raw, geometry, "json"))
            assert out["answer"] == expected and out["thought"] is None
            actions = parse_actions(json.dumps(expected), "json")
            assert out["actions"] == [a.model_dump() for a in actions]
            seen += len(points(json.dumps(expected)))
    assert seen > 0, "no answer carried coordinates; use more steps"


async def test_the_prompt_states_the_profiles_coordinates(fleet: Fleet) -> None:
    step = make_step(0, f"ep-{new_id()[-8:]}")
    prepared = prepare_frame(step.frames[-1].data, limits_from(fleet.pre))
    assert isinstance(prepared, PreparedFrame)
    req = to_generate(step, [prepared], fleet.pre)
    assert req.messages is not None and isinstance(req.messages[0].content, str)
    relative = "Coordinates are relative, 0-1000" in req.messages[0].content
    assert relative == (fleet.vlm == "qwen3-vl")
