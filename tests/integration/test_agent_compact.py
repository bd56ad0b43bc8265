"""Compact agent answers end to end, on a real-NATS `sim` fleet with the edge:

agent.in (or `/v1/agent/step`) with `action_format="compact"` -> preprocessor (derives
max_tokens from the format and chunk, resizes 1280x720 to 308x168) -> router -> `sim`
worker (answers valid compact lines) -> parsed actions in the original frame's pixels.
An answer cut anyway reaches the client as the typed error `answer_cut`, and is counted.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial

import httpx
import pytest

from services.edge.agent import AGENT_STATUS
from services.edge.errors import ApiError
from services.preprocessor.agent import limits_from, to_generate
from services.preprocessor.images import PreparedFrame, prepare_frame
from services.preprocessor.settings import PreprocessorSettings
from services.worker import metrics as worker_metrics
from switchyard import subjects
from switchyard.agentactions import (
    answer_token_budget,
    map_points,
    parse_actions,
    parse_answer_text,
)
from switchyard.agentprompt import Geometry
from switchyard.bus.connection import Bus, connect
from switchyard.codec import decode
from switchyard.config import Settings
from switchyard.ids import new_id
from switchyard.messages.agent import AgentStep, RawFrame, StepOptions
from switchyard.messages.inference import (
    ActionsConstraint,
    GenerateRequest,
    GenerateResult,
    Sampling,
)
from tests.integration.test_agent_coords import ORIGINAL, frame
from tests.integration.test_agent_path import final, send
from tests.support.agentanswers import old_mapping
from tests.support.edge import agent_fleet_with_edge, write_keys
from tests.support.fleet import submit

MAX_PIXELS = 320 * 180  # the model sees 308x168
KEY = "sk-compact"
TENANT = "compact"


@dataclass(frozen=True)
class Fleet:
    bus: Bus
    edge: str
    pre: PreprocessorSettings


@pytest.fixture(scope="module")
async def fleet(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    pool = f"cp{new_id().lower()[-8:]}"
    keys = write_keys(tmp_path_factory.mktemp("compact") / "keys.yaml", {KEY: {"tenant": TENANT}})
    # `single`: a step's prompt holds its own frame alone, so the test can ask the model
    # the same prompt again (a `window` prompt holds the session's earlier frames too).
    pre = PreprocessorSettings(
        nats_url=nats_url, agent_pool=pool, max_pixels=MAX_PIXELS, agent_layout="single"
    )
    bus = await connect(Settings(nats_url=nats_url), "pytest-agent-compact")
    try:
        async with agent_fleet_with_edge(
            nats_url, pool, keys, engine="sim", edge={},
            preprocessor={"max_pixels": MAX_PIXELS, "agent_layout": "single"},
        ) as url:  # fmt: skip
            yield Fleet(bus, url, pre)
    finally:
        await bus.close()


def make_step(k: int, session: str, options: StepOptions) -> AgentStep:
    return AgentStep(
        tenant=TENANT, session=session, step=k, frame_ts=time.time(), stale_after=120.0,
        frames=[RawFrame(data=frame(k), mime="image/png")], goal="collect the daily reward",
        history=["click 1 2"] * k, options=options,
    )  # fmt: skip


def prepared(f: Fleet, step: AgentStep) -> GenerateRequest:
    """The request the preprocessor makes of `step` (same prompt, same derived limits)."""
    frames = prepare_frame(step.frames[-1].data, limits_from(f.pre))
    assert isinstance(frames, PreparedFrame)
    return to_generate(step, [frames], f.pre)


def points(actions: list[object]) -> list[tuple[int, int]]:
    out = []
    for a in actions:
        d = a.model_dump()  # type: ignore[attr-defined]
        out += [(d[x], d[y]) for x, y in (("x", "y"), ("x1", "y1"), ("x2", "y2")) if x in d]
    return out


def test_max_tokens_is_derived_from_format_and_chunk_never_below() -> None:
    pre = PreprocessorSettings(agent_max_tokens=64)
    step = make_step(0, "s-limits", StepOptions())
    img = prepare_frame(step.frames[0].data, limits_from(pre))
    assert isinstance(img, PreparedFrame)
    for opts, want in [
        (StepOptions(), answer_token_budget("compact", 1)),  # the default format
        (StepOptions(action_format="json"), answer_token_budget("json", 1)),
        (StepOptions(action_format="compact", chunk=3), answer_token_budget("compact", 3)),
        (StepOptions(action_format="compact", chunk=5, max_tokens=8),  # asked for too few
         answer_token_budget("compact", 5)),
        (StepOptions(action_format="compact", max_tokens=60), 60),  # more, within the cap
        (StepOptions(action_format="compact", max_tokens=500), 64),  # capped at the setting
        (StepOptions(chunk=2, thought=True), answer_token_budget("compact", 2, True)),
    ]:  # fmt: skip
        req = to_generate(step.model_copy(update={"options": opts}), [img], pre)
        assert req.sampling.max_tokens == want, opts
        assert req.constraint == ActionsConstraint(
            action_format=opts.action_format, chunk=opts.chunk, thought=opts.thought
        )
    no_thought = PreprocessorSettings(allow_thought=False)
    req = to_generate(step.model_copy(update={"options": StepOptions(thought=True)}), [img],
                      no_thought)  # fmt: skip
    assert req.constraint == ActionsConstraint(action_format="compact", thought=False)
    assert req.sampling.max_tokens == answer_token_budget("compact", 1, False)


async def test_compact_steps_on_the_bus_answer_mapped_actions(fleet: Fleet) -> None:
    session = f"ep-{new_id()[-8:]}"
    seen = changed = 0
    for k in range(6):
        opts = StepOptions(action_format="compact", chunk=3, thought=k % 2 == 1)
        step = make_step(k, session, opts)
        res = final(await send(fleet.bus, step))
        assert res.status == "ok", res.error
        answer = parse_answer_text(res.text, "compact", chunk=3, thought=opts.thought)
        assert len(answer.actions) == 3  # the sim fills the chunk
        assert (answer.thought is not None) == opts.thought
        assert res.usage.completion_tokens < answer_token_budget("compact", 3, opts.thought)
        # The model's own answer (the same prompt without the geometry) maps onto it.
        req = prepared(fleet, step)
        assert req.frame_geometry is not None
        raw = final(await submit(fleet.bus, req.model_copy(
            update={"id": new_id(), "frame_geometry": None, "reply": None})))  # fmt: skip
        assert raw.status == "ok", raw.error
        assert res.text == old_mapping(raw.text, Geometry.of(req.frame_geometry), "compact")
        assert res.actions == list(answer.actions) and res.thought == answer.thought
        for x, y in points(list(answer.actions)):
            assert 0 <= x < ORIGINAL[0] and 0 <= y < ORIGINAL[1]
        seen += len(points(list(answer.actions)))
        changed += res.text != raw.text
    assert seen > 0 and changed > 0, "no answer carried coordinates; use more steps"


async def test_the_edge_returns_compact_text_and_its_parsed_actions(fleet: Fleet) -> None:
    session = f"ep-{new_id()[-8:]}"
    async with httpx.AsyncClient(base_url=fleet.edge, timeout=60) as http:
        for k in range(3):
            body = {
                "frames": [{"data": base64.b64encode(frame(k)).decode(), "mime": "image/png"}],
                "session": session, "frame_ts": time.time(), "stale_after": 120.0, "step": k,
                "options": {"action_format": "compact", "chunk": 2},
            }  # fmt: skip
            resp = await http.post(
                "/v1/agent/step", json=body, headers={"Authorization": f"Bearer {KEY}"}
            )
            assert resp.status_code == 200, resp.text
            out = resp.json()
            assert isinstance(out["answer"], str) and not out["answer"].startswith("{")
            actions = parse_actions(out["answer"], "compact")
            assert [a.model_dump() for a in actions] == out["actions"]
            assert len(actions) == 2 and out["thought"] is None
            for x, y in points(list(actions)):
                assert 0 <= x < ORIGINAL[0] and 0 <= y < ORIGINAL[1]


async def test_the_edge_returns_grid_text_and_its_actions_in_the_phones_pixels(
    fleet: Fleet,
) -> None:
    """`grid`: the text is the model's, on its 0-999 grid; the actions are that text
    mapped to the phone's pixels (the grid is 0..1000 whatever the pool's profile)."""
    session = f"ep-{new_id()[-8:]}"
    geometry = Geometry(*ORIGINAL, *ORIGINAL)
    async with httpx.AsyncClient(base_url=fleet.edge, timeout=60) as http:
        for k in range(3):
            body = {
                "frames": [{"data": base64.b64encode(frame(k)).decode(), "mime": "image/png"}],
                "session": session, "frame_ts": time.time(), "stale_after": 120.0, "step": k,
                "options": {"action_format": "grid", "chunk": 3},
            }  # fmt: skip
            resp = await http.post(
                "/v1/agent/step", json=body, headers={"Authorization": f"Bearer {KEY}"}
            )
            assert resp.status_code == 200, resp.text
            out = resp.json()
            grid = parse_answer_text(out["answer"], "grid", chunk=3, thought=False)
            to = partial(geometry.to_original, coords="relative-1000")
            assert [a.model_dump() for a in map_points(grid, to).actions] == out["actions"]
            assert len(out["actions"]) == 3


async def test_a_cut_answer_is_a_typed_error_and_counted(fleet: Fleet) -> None:
    """A producer that sends an agent request with too small a max_tokens (the
    preprocessor never does): the worker answers `answer_cut`, never a partial action."""
    step = make_step(0, f"ep-{new_id()[-8:]}", StepOptions(action_format="compact"))
    req = prepared(fleet, step)
    cut_before = worker_metrics.ANSWERS_CUT.labels("compact", "length")._value.get()
    short = req.model_copy(update={"id": new_id(), "reply": None,
                                   "sampling": Sampling(max_tokens=2)})  # fmt: skip
    stored = await fleet.bus.nc.subscribe(subjects.res("agent", TENANT))
    try:
        frames = await submit(fleet.bus, short)
        # The client's inbox: one typed error frame, no text to act on.
        assert [(f.type, f.error.code if f.error else None) for f in frames] == [
            ("error", "answer_cut")
        ]
        # RES: the result, with what was cut kept for forensics.
        while True:
            res = decode((await stored.next_msg(timeout=10)).data, GenerateResult)
            if res.request_id == short.id:
                break
    finally:
        await stored.unsubscribe()
    assert res.status == "error" and res.finish_reason == "length" and res.text
    assert res.error is not None and res.error.code == "answer_cut", res.error
    assert worker_metrics.ANSWERS_CUT.labels("compact", "length")._value.get() == cut_before + 1
    # What the edge makes of that end frame for an HTTP client.
    assert frames[-1].error is not None
    err = ApiError.from_info(frames[-1].error, AGENT_STATUS)
    assert (err.status, err.code) == (502, "answer_cut")
