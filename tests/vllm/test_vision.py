"""The agent path's images through real vLLM: a tiny random-weight Qwen2.5-VL on the CPU.

The checkpoint (deploy/local/make_tiny_vlm.py) has Qwen2.5-VL's vision geometry (14 px
patches merged 2x2: one visual token per 28x28 px) and SmolLM2's tokenizer with the
Qwen-VL vision tokens; its answers are noise, its prompt accounting is vLLM's own. The
engine (`vision_engine`) caps frames at VISION_MAX_PIXELS and takes two per prompt.

Visual tokens are counted as vLLM reports them: the prompt's token count minus what the
same conversation renders to with one `<|image_pad|>` per frame.
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

import pytest
from PIL import Image as PILImage
from PIL import ImageDraw

from switchyard.agentactions import answer_token_budget, parse_answer_text
from switchyard.agentprompt import fit, visual_tokens
from switchyard.engines.base import Delta, EngineRequest
from switchyard.engines.vllm import VllmEngine, chat_conversation
from switchyard.messages.inference import (
    ActionsConstraint,
    ChatMessage,
    Constraint,
    Image,
    ImagePart,
    NoConstraint,
    Sampling,
    TextPart,
)
from switchyard.vlmgeometry import PROFILES

from .conftest import VISION_MAX_PIXELS

# The checkpoint's geometry, Qwen2.5-VL's, not the default profile's (qwen3-vl, 32 px):
# every estimate here passes it.
PATCH = PROFILES["qwen2.5-vl"].patch_px
BLOCK = 32  # engine_settings' KV block size: only full blocks are prefix-cached
# Long enough for a few full KV blocks before the first frame.
SYSTEM = (
    "You are an agent that plays a mobile game on a cloud phone. Each step you see the "
    "previous and the current screenshot and the actions taken so far. Never tap ads or "
    "purchases; close pop-ups; wait while a spinner shows; do not explain. Coordinates "
    "are pixels of the current screenshot, origin top left."
)


def png(width: int, height: int, seed: int) -> bytes:
    """A phone-like screenshot: a coloured background, a bar and a few buttons."""
    im = PILImage.new("RGB", (width, height), ((seed * 67) % 256, (seed * 131) % 256, 90))
    draw = ImageDraw.Draw(im)
    draw.rectangle((0, 0, width, height // 12), fill=(20, 20, 20))
    for i in range(4):
        y = height // 3 + i * height // 8
        draw.rounded_rectangle((width // 6, y, 5 * width // 6, y + height // 14), 12,
                               fill=((seed * 29 + i * 50) % 256, 200, 120))  # fmt: skip
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def frame(seed: int, width: int = 720, height: int = 1280, *, hash_: str | None = None) -> Image:
    return Image(
        hash=hash_ or f"{seed:08x}{width:012x}{height:012x}",
        data=png(width, height, seed),
        mime="image/png",
        width=width,
        height=height,
    )


def agent_request(
    rid: str,
    frames: tuple[Image, ...],
    *,
    query: str = "What next?",
    max_tokens: int = 2,
    constraint: Constraint | None = None,
) -> EngineRequest:
    parts: list[TextPart | ImagePart] = [TextPart(text="Goal: open the daily reward.\n")]
    parts += [ImagePart(hash=f.hash) for f in frames]
    parts.append(TextPart(text=query))
    return EngineRequest(
        request_id=rid,
        messages=(
            ChatMessage(role="system", content=SYSTEM),
            ChatMessage(role="user", content=parts),
        ),
        images=frames,
        sampling=Sampling(max_tokens=max_tokens, temperature=0.0, seed=1),
        constraint=constraint or NoConstraint(),
    )


async def run(engine: VllmEngine, request: EngineRequest) -> list[Delta]:
    return [d async for d in engine.generate(request)]


@pytest.fixture(scope="module")
def tokenizer(tiny_vlm: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_vlm)


def rendered_ids(tokenizer: Any, request: EngineRequest) -> list[int]:
    """The prompt as the engine renders it, before vLLM expands each `<|image_pad|>`."""
    conversation, _ = chat_conversation(request)
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def visual_tokens_seen(tokenizer: Any, request: EngineRequest, prompt_tokens: int) -> int:
    """Visual tokens vLLM put in the prompt, over all of its frames."""
    return prompt_tokens - len(rendered_ids(tokenizer, request)) + len(request.images)


def smart_resize_tokens(width: int, height: int, max_pixels: int) -> int:
    """What Qwen2-VL's `smart_resize` makes of a frame (rounds sides to 28 px, then
    shrinks to max_pixels by flooring): vLLM's own count, for raw frames."""
    h, w = round(height / PATCH) * PATCH, round(width / PATCH) * PATCH
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = math.floor(height / beta / PATCH) * PATCH
        w = math.floor(width / beta / PATCH) * PATCH
    return (h // PATCH) * (w // PATCH)


def estimate(width: int, height: int, max_pixels: int = VISION_MAX_PIXELS) -> int:
    return visual_tokens(*fit(width, height, max_pixels, PATCH), PATCH)


async def test_one_frame_costs_the_estimated_visual_tokens(
    vision_engine: VllmEngine, tokenizer: Any
) -> None:
    """A raw 720x1280 screenshot: vLLM shrinks it to 364x644, 13x23 = 299 visual tokens,
    what `agentprompt.visual_tokens(*fit(...))` estimates."""
    request = agent_request("one-frame", (frame(1),))
    deltas = await run(vision_engine, request)
    assert deltas[-1].finish_reason in ("length", "stop")
    seen = visual_tokens_seen(tokenizer, request, deltas[-1].prompt_tokens)
    assert seen == estimate(720, 1280) == 299


async def test_two_frames_per_prompt(vision_engine: VllmEngine, tokenizer: Any) -> None:
    request = agent_request("two-frames", (frame(2), frame(3)))
    deltas = await run(vision_engine, request)
    seen = visual_tokens_seen(tokenizer, request, deltas[-1].prompt_tokens)
    assert seen == 2 * estimate(720, 1280)


@pytest.mark.parametrize("size", [(720, 1280), (1080, 1920), (1280, 720), (360, 640), (1080, 2400)])
async def test_fitted_frames_pass_through_unchanged(
    vision_engine: VllmEngine, tokenizer: Any, size: tuple[int, int]
) -> None:
    """The preprocessor's frames (`fit`: whole 28 px tokens, within max_pixels) are what
    the model sees: their visual tokens are exactly `visual_tokens(w, h)`."""
    w, h = fit(*size, VISION_MAX_PIXELS, PATCH)
    request = agent_request(f"fitted-{w}x{h}", (frame(4, w, h),))
    deltas = await run(vision_engine, request)
    assert visual_tokens_seen(tokenizer, request, deltas[-1].prompt_tokens) == visual_tokens(
        w, h, PATCH
    )


@pytest.mark.parametrize("size", [(1080, 1920), (1440, 2560), (360, 640), (500, 900)])
async def test_raw_frames_follow_smart_resize(
    vision_engine: VllmEngine, tokenizer: Any, size: tuple[int, int]
) -> None:
    """A frame not already fitted: vLLM counts `smart_resize`'s tokens. Above max_pixels
    that equals the estimate; below it smart_resize *rounds* each side to 28 px where
    `fit` floors, so a 360x640 frame costs 13x23 = 299 tokens, not the estimate's 12x22 =
    264 - within one row and one column of tokens."""
    w, h = size
    request = agent_request(f"raw-{w}x{h}", (frame(5, w, h),))
    deltas = await run(vision_engine, request)
    seen = visual_tokens_seen(tokenizer, request, deltas[-1].prompt_tokens)
    assert seen == smart_resize_tokens(w, h, VISION_MAX_PIXELS)
    fw, fh = fit(w, h, VISION_MAX_PIXELS, PATCH)
    assert estimate(w, h) <= seen <= (fw // PATCH + 1) * (fh // PATCH + 1)
    if w * h >= VISION_MAX_PIXELS:
        assert seen == estimate(w, h)


async def test_max_pixels_caps_the_visual_tokens(vision_engine: VllmEngine, tokenizer: Any) -> None:
    """VllmSettings.max_pixels (vLLM's mm_processor_kwargs): a 1440x2560 frame costs at
    most max_pixels / 28^2 tokens, not the checkpoint's own limit (1280 tokens)."""
    request = agent_request("max-pixels", (frame(6, 1440, 2560),))
    deltas = await run(vision_engine, request)
    seen = visual_tokens_seen(tokenizer, request, deltas[-1].prompt_tokens)
    assert seen <= VISION_MAX_PIXELS // PATCH**2
    assert seen == estimate(1440, 2560)
    assert seen < estimate(1440, 2560, 1280 * PATCH**2)


def _prefix_before_frames(tokenizer: Any, request: EngineRequest) -> int:
    ids = rendered_ids(tokenizer, request)
    return ids.index(tokenizer.convert_tokens_to_ids("<|vision_start|>"))


async def test_a_repeated_frame_is_a_prefix_hit_and_a_new_one_is_not(
    vision_engine: VllmEngine, tokenizer: Any
) -> None:
    """multi_modal_uuids: the same frame (same hash) again is served from the prefix
    cache through and past its visual tokens; a different frame (another hash) hits only
    the text before it."""
    first = agent_request("repeat-1", (frame(7),))
    await run(vision_engine, first)
    again = await run(vision_engine, agent_request("repeat-2", (frame(7),)))
    prompt = again[-1].prompt_tokens
    assert again[-1].cached_tokens >= (prompt - 1) // BLOCK * BLOCK - BLOCK
    assert again[-1].cached_tokens > _prefix_before_frames(tokenizer, first) + 299

    other = await run(vision_engine, agent_request("repeat-3", (frame(8),)))
    text_prefix = _prefix_before_frames(tokenizer, first)
    assert 0 < other[-1].cached_tokens <= text_prefix
    assert other[-1].cached_tokens == text_prefix // BLOCK * BLOCK


async def test_the_hash_not_the_pixels_keys_the_cache(
    vision_engine: VllmEngine, tokenizer: Any
) -> None:
    """vLLM trusts multi_modal_uuids: the same pixels under a new hash miss, and (why the
    hash must be the content's) other pixels under a known hash are taken for it - KV,
    encoder output and even the token count."""
    await run(vision_engine, agent_request("uuid-1", (frame(9),)))
    text_prefix = _prefix_before_frames(tokenizer, agent_request("x", (frame(9),)))
    renamed = await run(vision_engine, agent_request("uuid-2", (frame(9, hash_="f" * 32),)))
    assert renamed[-1].cached_tokens <= text_prefix
    impostor = await run(vision_engine, agent_request("uuid-3", (frame(10, hash_=frame(9).hash),)))
    assert impostor[-1].cached_tokens > text_prefix + 299 - BLOCK
    # Even another size: vLLM's processor cache returns the known frame's item, so a
    # 336x616 frame (264 tokens of its own) costs the 720x1280 frame's 299.
    small = agent_request("uuid-4", (frame(11, 336, 616, hash_=frame(9).hash),))
    deltas = await run(vision_engine, small)
    assert visual_tokens_seen(tokenizer, small, deltas[-1].prompt_tokens) == 299


async def test_a_two_frame_step_repeated_hits_both_frames(
    vision_engine: VllmEngine, tokenizer: Any
) -> None:
    await run(vision_engine, agent_request("pair-1", (frame(11), frame(12))))
    again = await run(vision_engine, agent_request("pair-2", (frame(11), frame(12))))
    prompt = again[-1].prompt_tokens
    assert again[-1].cached_tokens >= (prompt - 1) // BLOCK * BLOCK - BLOCK
    assert again[-1].cached_tokens > _prefix_before_frames(tokenizer, agent_request(
        "x", (frame(11),))) + 2 * 299 - BLOCK  # fmt: skip


async def test_an_agent_step_answers_in_the_compact_language(vision_engine: VllmEngine) -> None:
    """Random weights, but the step's regex forces an answer `parse_answer_text` reads."""
    constraint = ActionsConstraint(action_format="compact", chunk=1)
    budget = answer_token_budget("compact", 1, False)
    for i in range(2):
        request = agent_request(f"act-{i}", (frame(20 + i), frame(21 + i)), query="Act.",
                                max_tokens=budget, constraint=constraint)  # fmt: skip
        deltas = await run(vision_engine, request)
        text = "".join(d.text for d in deltas)
        assert deltas[-1].finish_reason == "stop", text
        answer = parse_answer_text(text, "compact", chunk=1, thought=False)
        assert len(answer.actions) == 1, text
        assert re.fullmatch(r"[a-z_]+( .*)?", text.strip()), text
