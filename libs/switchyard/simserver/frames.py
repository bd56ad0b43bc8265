"""Frame markers: how an HTTP client puts a screenshot into a `sim-server` prompt cheaply.

A real VLM request carries each frame as an `image_url` part; a simulator needs only the
frame's identity and size to count its visual tokens. So a client writes a frame as the text
marker ``<|frame:HASH:WxH|>`` and the server turns it into an image part with that hash and
size: the routers in front see a short, unique text per frame (what their prefix matching
would see of a real image), and the engine prefills as many visual tokens as the real frame
would cost.
"""

from __future__ import annotations

import re

from switchyard.messages.inference import Image, ImagePart, TextPart

_MARKER = re.compile(r"<\|frame:([0-9a-f]{16,64}):(\d{1,5})x(\d{1,5})\|>")


def frame_marker(image_hash: str, width: int, height: int) -> str:
    return f"<|frame:{image_hash}:{width}x{height}|>"


def split_frames(text: str) -> tuple[list[TextPart | ImagePart], list[Image]]:
    """Text parts and image parts in order, plus the images the markers name."""
    parts: list[TextPart | ImagePart] = []
    images: list[Image] = []
    pos = 0
    for m in _MARKER.finditer(text):
        if m.start() > pos:
            parts.append(TextPart(text=text[pos : m.start()]))
        image_hash, width, height = m.group(1), int(m.group(2)), int(m.group(3))
        if width < 1 or height < 1:
            raise ValueError(f"frame {image_hash} has an empty size {width}x{height}")
        parts.append(ImagePart(hash=image_hash))
        images.append(
            Image(hash=image_hash, data=b"", mime="image/png", width=width, height=height)
        )
        pos = m.end()
    if pos < len(text):
        parts.append(TextPart(text=text[pos:]))
    return parts, images
