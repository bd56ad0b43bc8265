"""Safe frame decoding, resizing to a pixel budget, one re-encode, content hash.

Everything here is a pure function of bytes and limits, so it runs in a
process pool (`prepare_frame` is picklable and returns plain dataclasses): a
decoder bug or a slow hostile image costs one pool process, never the event
loop. A rejection is *returned*, not raised, because an exception crossing the
pool loses its typed code when it is pickled.

Defences, in the order they apply:
- a byte cap before Pillow sees anything (a 50 MB upload is refused unread);
- a format allowlist given to `Image.open` (PNG, JPEG, WebP), so Pillow never
  tries its other, less hardened plugins, whatever the client's mime says;
- a pixel cap checked on the header before decoding (decompression bombs),
  with Pillow's own bomb check turned into an error as a second wall;
- a full `load()` inside the guard, so truncated or corrupt data fails here.
"""

from __future__ import annotations

import hashlib
import io
import time
import warnings
from dataclasses import dataclass
from typing import Literal

from PIL import Image, UnidentifiedImageError

from switchyard.agentprompt import Geometry, fit
from switchyard.errors import ErrorCode
from switchyard.vlmgeometry import DEFAULT_VLM, VlmName, vlm_profile

ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP")
OutputFormat = Literal["jpeg", "png", "webp"]
MIME = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}


@dataclass(frozen=True)
class FrameLimits:
    max_bytes: int = 3 * 1024 * 1024
    max_decode_pixels: int = 4096 * 4096  # what we agree to decode at all
    max_pixels: int = 1280 * 720  # the model's budget after resizing (720p-class)
    vlm: VlmName = DEFAULT_VLM  # whose visual tokens the frame is resized to whole ones of
    output: OutputFormat = "jpeg"
    quality: int = 90


@dataclass(frozen=True)
class PreparedFrame:
    hash: str
    data: bytes
    mime: str
    geometry: Geometry
    decode_s: float
    resize_s: float


@dataclass(frozen=True)
class FrameRejected:
    code: ErrorCode
    reason: str


def pixel_hash(img: Image.Image) -> str:
    """blake2b of the pixels (with size and mode): the frame's multimodal uuid."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{img.mode}:{img.width}x{img.height}:".encode())
    h.update(img.tobytes())
    return h.hexdigest()


def _decode(data: bytes, limits: FrameLimits) -> Image.Image | FrameRejected:
    if not data:
        return FrameRejected("invalid_request", "empty frame")
    if len(data) > limits.max_bytes:
        return FrameRejected("oversized", f"frame of {len(data)} bytes exceeds {limits.max_bytes}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=list(ALLOWED_FORMATS))
            w, h = img.size
            if w <= 0 or h <= 0:
                return FrameRejected("invalid_request", f"frame has zero size {w}x{h}")
            if w * h > limits.max_decode_pixels:
                return FrameRejected(
                    "oversized", f"frame of {w}x{h} pixels exceeds {limits.max_decode_pixels}"
                )
            img.load()
    except UnidentifiedImageError:
        return FrameRejected("invalid_request", "not a PNG, JPEG or WebP image")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        return FrameRejected("oversized", f"decompression bomb: {exc}")
    except (OSError, SyntaxError, ValueError) as exc:  # Pillow's ways of saying corrupt
        code: ErrorCode = "truncated" if "truncated" in str(exc).lower() else "invalid_request"
        return FrameRejected(code, f"corrupt image: {exc}")
    return img


def prepare_frame(data: bytes, limits: FrameLimits) -> PreparedFrame | FrameRejected:
    """Decode, resize to the pixel budget, hash the resized pixels, encode once."""
    t0 = time.perf_counter()
    img = _decode(data, limits)
    if isinstance(img, FrameRejected):
        return img
    t1 = time.perf_counter()
    rgb = img.convert("RGB")  # palette, alpha and grey frames hash and encode alike
    size = fit(rgb.width, rgb.height, limits.max_pixels, vlm_profile(limits.vlm).patch_px)
    resized = rgb if size == rgb.size else rgb.resize(size, Image.Resampling.BILINEAR)
    digest = pixel_hash(resized)
    out = io.BytesIO()
    fmt = limits.output.upper()
    resized.save(out, format=fmt, quality=limits.quality)
    geometry = Geometry(img.width, img.height, resized.width, resized.height, limits.vlm)
    return PreparedFrame(
        digest, out.getvalue(), MIME[limits.output], geometry, t1 - t0, time.perf_counter() - t1
    )
