"""Agent frames: safe decode, resize + hash, coordinate mapping, layout, answer schema."""

from __future__ import annotations

import io
import random
import struct
import zlib

import pytest
from PIL import Image as PILImage

from services.preprocessor.images import FrameLimits, FrameRejected, PreparedFrame, prepare_frame
from switchyard.agentprompt import Geometry, build_messages, fit
from switchyard.engines.base import EngineRequest
from switchyard.engines.sim import SimSettings
from switchyard.engines.sim_tokens import render_prompt
from switchyard.messages.agent import AgentStep, RawFrame, answer_schema
from switchyard.messages.inference import Image
from switchyard.vlmgeometry import vlm_profile

LIMITS = FrameLimits(max_bytes=1024 * 1024, max_decode_pixels=2000 * 2000, max_pixels=640 * 360)


def png(w: int, h: int, color: tuple[int, int, int] = (10, 200, 30), fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (w, h), color).save(out, format=fmt)
    return out.getvalue()


def prepared(data: bytes, limits: FrameLimits = LIMITS) -> PreparedFrame:
    out = prepare_frame(data, limits)
    assert isinstance(out, PreparedFrame), out
    return out


def bomb_png(w: int, h: int) -> bytes:
    """A tiny PNG whose header announces w x h pixels (the IDAT is a few bytes)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def test_resize_keeps_aspect_and_budget() -> None:
    frame = prepared(png(1920, 1080))
    g = frame.geometry
    assert g.width * g.height <= LIMITS.max_pixels
    patch = vlm_profile(g.vlm).patch_px
    assert g.width % patch == 0 and g.height % patch == 0
    assert abs(g.width / g.height - 1920 / 1080) < 0.1
    assert frame.mime == "image/jpeg" and frame.data[:2] == b"\xff\xd8"


def test_same_frame_same_hash_and_different_frame_different_hash() -> None:
    a, b = png(800, 600), png(800, 600)
    assert prepared(a).hash == prepared(b).hash
    assert prepared(a).hash != prepared(png(800, 600, (11, 200, 30))).hash
    # The hash is of the resized pixels: the same picture as PNG or WebP-lossless agrees.
    lossless = io.BytesIO()
    PILImage.open(io.BytesIO(a)).save(lossless, format="WEBP", lossless=True)
    assert prepared(lossless.getvalue()).hash == prepared(a).hash


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", "invalid_request"),
        (b"GIF89a" + b"\0" * 64, "invalid_request"),  # a format outside the allowlist
        (b"<html>not an image</html>", "invalid_request"),
        (png(64, 64)[:60], "truncated"),
        (b"\0" * (LIMITS.max_bytes + 1), "oversized"),
        (bomb_png(30_000, 30_000), "oversized"),
    ],
    ids=["empty", "gif", "html", "truncated", "too-many-bytes", "bomb"],
)
def test_hostile_frames_are_typed_rejections(data: bytes, code: str) -> None:
    out = prepare_frame(data, LIMITS)
    assert isinstance(out, FrameRejected) and out.code == code, out


def test_gif_is_refused_even_when_valid() -> None:
    out = prepare_frame(png(32, 32, fmt="GIF"), LIMITS)
    assert isinstance(out, FrameRejected)


def test_resized_coordinates_map_back_to_the_same_place() -> None:
    """Property over random frame sizes and points (seeded: failures reproduce)."""
    rnd = random.Random(6)
    for _ in range(2000):
        w, h = rnd.randint(1, 4000), rnd.randint(1, 4000)
        rw, rh = fit(w, h, 1280 * 720, 28)  # a pixel-coordinate profile's 28-px tokens
        assert rw * rh <= max(1280 * 720, 28 * 28 * 2) or min(w, h) < 28
        g = Geometry(w, h, rw, rh, "qwen2.5-vl")
        x, y = rnd.randrange(rw), rnd.randrange(rh)
        ox, oy = g.to_original(x, y)
        assert 0 <= ox < w and 0 <= oy < h
        # The original pixel lies inside the area the resized pixel covers.
        assert x * w / rw - 1 <= ox <= (x + 1) * w / rw, (w, h, rw, rh, x)
        assert y * h / rh - 1 <= oy <= (y + 1) * h / rh, (w, h, rw, rh, y)


def _image(seed: int) -> Image:
    return Image(hash=f"{seed:032x}", data=b"", mime="image/jpeg", width=1260, height=700)


def _tokens(step: int, history: list[str]) -> list[str]:
    frames = [_image(step - 1), _image(step)]
    s = AgentStep(
        tenant="t", session="e1", frame_ts=0.0, step=step, history=history,
        frames=[RawFrame(data=b"x")] * 2,
    )  # fmt: skip
    req = EngineRequest(
        request_id=f"r{step}", messages=tuple(build_messages(s, frames)), images=tuple(frames)
    )
    return render_prompt(req, SimSettings())


def test_layout_consecutive_steps_share_system_and_history() -> None:
    a = _tokens(3, ["click 1 2", "back", "wait 100"])
    b = _tokens(4, ["click 1 2", "back", "wait 100", "click 5 6"])
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    history_end = a.index("<|vision_start|>")
    # Everything up to the end of step 3's history is reused; the previous frame
    # follows a longer history in step 4, so a positional cache cannot serve it.
    assert shared >= history_end - 2
    assert a[history_end + 1].startswith("<img:" + f"{3 - 1:032x}")
    assert f"<img:{3:032x}:0>" in b[b.index("<|vision_start|>") :][:3]  # prev frame = old current


def test_answer_schema() -> None:
    one = answer_schema()
    assert "actions" not in one.get("properties", {})
    chunk = answer_schema(chunk=3, thought=False)
    assert chunk["properties"]["actions"]["maxItems"] == 3 and "thought" not in chunk["properties"]
    assert "thought" in answer_schema(chunk=2, thought=True)["properties"]
