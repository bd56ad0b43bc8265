"""VLM profiles: the visual-token size and coordinate convention of the pool's model.

Qwen2.5-VL tiles frames in 28-px tokens and answers in pixels of the resized frame;
Qwen3-VL tiles them in 32-px tokens and answers 0-1000 on each axis
(`switchyard.vlmgeometry` cites the sources). The preprocessor resizes, estimates and
prompts with the pool's profile, records it on the request, and the worker maps back
with the recorded one.
"""

from __future__ import annotations

import io
import math
import random
import re

import pytest
from PIL import Image as PILImage

from services.preprocessor.agent import limits_from, to_generate
from services.preprocessor.images import FrameLimits, PreparedFrame, prepare_frame
from services.preprocessor.layout import estimate_prompt_tokens
from services.preprocessor.settings import PreprocessorSettings
from switchyard.agentactions import (
    answer_regex,
    answer_token_budget,
    parse_actions,
    parse_answer_text,
)
from switchyard.agentprompt import (
    SYSTEM_PROMPTS,
    Geometry,
    build_messages,
    fit,
    system_prompt,
    visual_tokens,
)
from switchyard.bench.agentsim import AgentSimConfig, AgentSimConfigError, _PrefixModel
from switchyard.engines.base import EngineRequest
from switchyard.engines.sim import SimEngine, SimSettings
from switchyard.engines.sim_output import sim_answer
from switchyard.messages.agent import AgentStep, RawFrame, StepOptions
from switchyard.messages.inference import (
    ActionsConstraint,
    ChatMessage,
    FrameGeometry,
    Image,
    Sampling,
)
from switchyard.scheduling.affinity import prefix_blocks
from switchyard.vlmgeometry import DEFAULT_VLM, PROFILES, VLM_NAMES, vlm_profile

# vLLM's max_pixels for the fleet's VLM (`VllmSettings.max_pixels`).
ENGINE_MAX_PIXELS = 1280 * 28 * 28


def test_the_profiles_say_what_the_models_do() -> None:
    q25, q3 = vlm_profile("qwen2.5-vl"), vlm_profile("qwen3-vl")
    assert (q25.patch_px, q25.coords) == (14 * 2, "pixels")  # patch 14, merged 2x2
    assert (q3.patch_px, q3.coords) == (16 * 2, "relative-1000")  # patch 16, merged 2x2
    assert (q25.default_min_pixels, q25.default_max_pixels) == (56 * 56, 12_845_056)
    assert (q3.default_min_pixels, q3.default_max_pixels) == (256 * 256, 4096 * 4096)
    assert DEFAULT_VLM == "qwen3-vl"  # the seeds' Qwen3-VL-8B unless a pool says otherwise
    assert set(VLM_NAMES) == set(PROFILES)
    with pytest.raises(ValueError, match=r"qwen2\.5-vl, qwen3-vl"):
        vlm_profile("llava")


# -- resize and token counts ----------------------------------------------------------


@pytest.mark.parametrize(
    ("vlm", "budget", "size", "tokens"),
    [
        # A portrait 720p phone frame at the default 720p-class budget: already in budget.
        ("qwen2.5-vl", 1280 * 720, (700, 1260), 25 * 45),
        ("qwen3-vl", 1280 * 720, (704, 1280), 22 * 40),
        # A quarter of the pixels: each side halved (360x640), then whole tokens.
        ("qwen2.5-vl", 640 * 360, (336, 616), 12 * 22),
        ("qwen3-vl", 640 * 360, (352, 640), 11 * 20),
    ],
)
def test_fit_and_visual_tokens_follow_the_profile(
    vlm: str, budget: int, size: tuple[int, int], tokens: int
) -> None:
    patch = vlm_profile(vlm).patch_px
    w, h = fit(720, 1280, budget, patch)
    assert (w, h) == size
    assert w % patch == 0 and h % patch == 0 and w * h <= budget
    assert visual_tokens(w, h, patch) == tokens


def smart_resize(h: int, w: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' `smart_resize` (qwen2_vl/image_processing_qwen2_vl.py), which vLLM
    applies to every Qwen2.5-VL and Qwen3-VL image (`factor` = patch x merge)."""
    h_bar, w_bar = round(h / factor) * factor, round(w / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        h_bar = math.floor(h / beta / factor) * factor
        w_bar = math.floor(w / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        h_bar = math.ceil(h * beta / factor) * factor
        w_bar = math.ceil(w * beta / factor) * factor
    return h_bar, w_bar


@pytest.mark.parametrize("vlm", VLM_NAMES)
def test_the_engine_keeps_the_preprocessors_frame(vlm: str) -> None:
    """What `fit` makes, the engine's own resize leaves alone: the model sees that frame,
    so a pixel answer is in its pixels and the token estimate is the engine's count."""
    p = vlm_profile(vlm)
    for w, h in [(1280, 720), (720, 1280), (1080, 2400), (1920, 1080), (2560, 1440), (800, 600)]:
        for budget in (1280 * 720, 640 * 360, 960 * 540):
            fw, fh = fit(w, h, budget, p.patch_px)
            assert smart_resize(fh, fw, p.patch_px, p.default_min_pixels, ENGINE_MAX_PIXELS) == (
                fh, fw,
            )  # fmt: skip


# -- mapping answers back ---------------------------------------------------------------


def test_relative_coordinates_map_to_the_original_pixel_under_them() -> None:
    # The resized size plays no part: 0-1000 is relative to the frame, whatever its size.
    for width, height in [(704, 1280), (352, 640), (32, 32)]:
        g = Geometry(1080, 2400, width, height, "qwen3-vl")
        assert g.to_original(0, 0) == (0, 0)
        assert g.to_original(500, 500) == (540, 1200)
        assert g.to_original(999, 999) == (1078, 2397)  # floor(999 / 1000 * 1080) = 1078
        # 1000 is the far edge itself: the last pixel, as is anything beyond it.
        assert g.to_original(1000, 1000) == (1079, 2399)
        assert g.to_original(16384, 1001) == (1079, 2399)
        assert g.to_original(1, 1) == (1, 2)  # 1/1000 of 1080 px lies in pixel 1
    # Exact at pixel boundaries: 580/1000 of 50 px is the start of pixel 29, which float
    # arithmetic would put at 28.999999999999996.
    assert math.floor(580 / 1000 * 50) == 28
    assert Geometry(50, 100, 32, 64, "qwen3-vl").to_original(580, 290) == (29, 29)


def test_pixel_coordinates_still_map_by_the_resized_frame() -> None:
    g = Geometry(1280, 720, 308, 168, "qwen2.5-vl")
    assert Geometry(1280, 720, 308, 168).vlm == DEFAULT_VLM == "qwen3-vl"
    assert g.to_original(154, 84) == (642, 362)
    assert g.to_original(0, 0) == (2, 2) and g.to_original(307, 167) == (1277, 717)
    # The same numbers read as relative land elsewhere: the profile decides.
    assert Geometry(1280, 720, 308, 168, "qwen3-vl").to_original(154, 84) == (197, 60)


def test_the_request_carries_the_profile_and_old_messages_mean_qwen25() -> None:
    g = Geometry(1080, 2400, 704, 1280, "qwen3-vl")
    fg = g.frame_geometry()
    assert fg.vlm == "qwen3-vl" and Geometry.of(fg) == g
    old = FrameGeometry.model_validate(
        {"orig_width": 1280, "orig_height": 720, "width": 308, "height": 168}
    )
    assert old.vlm == "qwen2.5-vl"
    with pytest.raises(ValueError):
        FrameGeometry(orig_width=1, orig_height=1, width=1, height=1, vlm="llava")  # type: ignore[arg-type]


# -- the answer language admits 0-1000 --------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("compact", "click 1000 1000"),
        ("compact", "swipe 0 1000 1000 0 300\nlong_press 1000 999 800"),
        ("json", '{"type":"click","x":1000,"y":1000}'),
        ("json", '{"type":"swipe","x1":0,"y1":1000,"x2":1000,"y2":0,"ms":300}'),
    ],
)
def test_the_grammar_admits_the_whole_relative_range(fmt: str, text: str) -> None:
    chunk = text.count("\n") + 1
    assert re.fullmatch(answer_regex(fmt, chunk), text)  # type: ignore[arg-type]
    parse_answer_text(text, fmt)  # type: ignore[arg-type]


# -- the prompt says the convention -------------------------------------------------------


@pytest.mark.parametrize("layout", ["pair", "single", "window"])
def test_the_system_prompt_states_the_profiles_coordinates(layout: str) -> None:
    pixels = system_prompt(layout, "compact", "qwen2.5-vl")  # type: ignore[arg-type]
    relative = system_prompt(layout, "compact")  # type: ignore[arg-type]
    assert "Coordinates are pixels of the current screenshot, origin top left." in pixels
    assert "relative, 0-1000" in relative and "origin top left" in relative
    assert "pixels of the current screenshot" not in relative
    # The defaults' prompts (compact answers, the default profile's coordinates).
    assert system_prompt(layout) == SYSTEM_PROMPTS[layout] == relative  # type: ignore[arg-type]


# -- the preprocessor --------------------------------------------------------------------


def png(w: int, h: int) -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (w, h), (10, 200, 30)).save(out, format="PNG")
    return out.getvalue()


def test_the_setting_picks_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    assert PreprocessorSettings().agent_vlm == "qwen3-vl"
    monkeypatch.setenv("SY_AGENT_VLM", "qwen2.5-vl")
    assert PreprocessorSettings().agent_vlm == "qwen2.5-vl"
    assert limits_from(PreprocessorSettings()).vlm == "qwen2.5-vl"
    monkeypatch.setenv("SY_AGENT_VLM", "qwen4-vl")
    with pytest.raises(ValueError, match="agent_vlm"):
        PreprocessorSettings()


def test_a_qwen3_step_is_resized_prompted_estimated_and_recorded_for_qwen3() -> None:
    frame = prepare_frame(png(720, 1280), FrameLimits(vlm="qwen3-vl"))
    assert isinstance(frame, PreparedFrame)
    g = frame.geometry
    assert (g.width, g.height, g.vlm) == (704, 1280, "qwen3-vl")
    step = AgentStep(
        tenant="t", session="s", step=0, frame_ts=0.0, goal="play",
        frames=[RawFrame(data=b"x")], options=StepOptions(action_format="compact"),
    )  # fmt: skip
    q3 = to_generate(step, [frame], PreprocessorSettings())  # the default profile
    assert q3.frame_geometry == FrameGeometry(
        orig_width=720, orig_height=1280, width=704, height=1280, vlm="qwen3-vl"
    )
    system = q3.messages[0].content if q3.messages else ""
    assert isinstance(system, str) and "relative, 0-1000" in system
    # Its frame costs 22 x 40 = 880 tokens of 32 px (26 x 46 = 1,196 counted in 28-px ones).
    assert q3.messages is not None
    assert q3.prompt_tokens == estimate_prompt_tokens(q3.messages, q3.images, "qwen3-vl")
    assert q3.prompt_tokens - estimate_prompt_tokens(q3.messages, q3.images, "qwen2.5-vl") == (
        880 - 1196
    )
    q25 = to_generate(step, [frame], PreprocessorSettings(agent_vlm="qwen2.5-vl"))
    assert q25.frame_geometry is not None and q25.frame_geometry.vlm == "qwen2.5-vl"


# -- the sim and the benches ---------------------------------------------------------------


def test_the_sim_simulates_the_profile() -> None:
    q25 = SimSettings(vlm="qwen2.5-vl")
    assert (q25.image_patch_px, q25.image_min_pixels) == (28, 4 * 28 * 28)
    q3 = SimSettings()  # the default profile
    assert (q3.vlm, q3.image_patch_px, q3.image_min_pixels) == ("qwen3-vl", 32, 65_536)
    assert q3.image_max_pixels == SimSettings().image_max_pixels  # the engine's cap
    assert SimSettings(vlm="qwen3-vl", image_patch_px=28).image_patch_px == 28  # explicit wins


def test_sim_answers_are_relative_for_a_relative_profile() -> None:
    rng = random.Random(7)
    small = Image(hash="ab" * 16, data=b"x", mime="image/jpeg", width=64, height=64)
    req = EngineRequest(request_id="r", images=(small,))
    c = ActionsConstraint(action_format="compact", chunk=5)
    points = []
    for _ in range(200):
        for a in parse_answer_text(sim_answer(c, req, rng, "relative-1000"), "compact").actions:
            d = a.model_dump()
            points += [d[k] for k in ("x", "y", "x1", "y1", "x2", "y2") if k in d]
    assert max(points) <= 1000 and max(points) > 900  # 0-1000, not the 64-px frame


async def test_the_sim_engine_counts_and_answers_as_its_profile() -> None:
    engine = SimEngine(SimSettings(vlm="qwen3-vl", delay_scale=0.0))
    await engine.start()
    try:
        frame = Image(hash="cd" * 16, data=b"x", mime="image/jpeg", width=704, height=1280)
        ask = (ChatMessage(role="user", content="next action?"),)
        bare = EngineRequest(request_id="b", messages=ask)
        req = EngineRequest(
            request_id="a", images=(frame,), messages=ask,
            sampling=Sampling(max_tokens=answer_token_budget("compact", 5)),
            constraint=ActionsConstraint(action_format="compact", chunk=5),
        )  # fmt: skip
        assert len(engine.prompt_tokens(req)) - len(engine.prompt_tokens(bare)) == 880 + 2
        text = "".join([d.text async for d in engine.generate(req)])
        assert len(parse_actions(text, "compact")) == 5
    finally:
        await engine.close()


def test_agent_sim_counts_its_profiles_tokens() -> None:
    with pytest.raises(AgentSimConfigError, match="vlm"):
        AgentSimConfig(vlm="llava")  # type: ignore[arg-type]
    q3 = _PrefixModel(AgentSimConfig(width=720, height=1280))  # the default profile
    assert q3.size == (704, 1280) and q3.sim.image_patch_px == 32
    q25 = AgentSimConfig(vlm="qwen2.5-vl", width=720, height=1280)
    assert _PrefixModel(q25).size == (700, 1260)
    step = AgentStep(tenant="t", session="s", step=0, frame_ts=0.0, frames=[RawFrame(data=b"x")])
    assert sum(t.startswith("<img:") for t in q3.tokens(step, 0)) == 880
    assert "relative" in "".join(q3.tokens(step, 0))


def test_the_routers_estimate_weighs_frames_by_the_profile() -> None:
    frame = Image(hash="ef" * 16, data=b"", mime="image/jpeg", width=704, height=1280)
    step = AgentStep(tenant="t", session="s", step=0, frame_ts=0.0, frames=[RawFrame(data=b"x")])
    messages = build_messages(step, [frame], "single", "qwen3-vl")
    q25 = prefix_blocks("salt", messages, None, [frame], vlm_profile("qwen2.5-vl").patch_px)
    q3 = prefix_blocks("salt", messages, None, [frame])  # the default profile
    assert q25[-1].tokens - q3[-1].tokens == visual_tokens(704, 1280, 28) - 880
