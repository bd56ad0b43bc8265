"""Synthetic game-like screens for the cloud-phone simulator, drawn with Pillow.

A frame is a function of (episode, step): a background colour per episode,
a few buttons whose places and labels move with the step, a score bar and,
on some steps, a pop-up. Same (episode, step) -> the same bytes, so a phone
that re-sends its previous frame sends it byte for byte, as a real one would.
"""

from __future__ import annotations

import io
import random

from PIL import Image, ImageDraw


def draw_frame(episode: int, step: int, size: tuple[int, int] = (1280, 720)) -> bytes:
    w, h = size
    rnd = random.Random(episode * 1_000_003 + step)
    base = random.Random(episode)
    bg = (base.randrange(30, 90), base.randrange(60, 140), base.randrange(90, 200))
    img = Image.new("RGB", size, bg)
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, w, h // 12), fill=(20, 20, 30))
    draw.text((10, 5), f"SCORE {step * 130 + episode}  LV {1 + step // 5}", fill=(250, 220, 80))
    for i in range(rnd.randint(2, 5)):
        x, y = rnd.randrange(0, w - w // 6), rnd.randrange(h // 8, h - h // 8)
        bw, bh = w // 8, h // 12
        draw.rounded_rectangle((x, y, x + bw, y + bh), radius=8, fill=(240, 160 - 20 * i, 40))
        draw.text((x + 8, y + bh // 3), rnd.choice(("PLAY", "OK", "NEXT", "SHOP", "X")), fill=0)
    if step % 4 == 3:  # a pop-up now and then, as games do
        draw.rectangle((w // 4, h // 4, 3 * w // 4, 3 * h // 4), fill=(250, 250, 250), outline=0)
        draw.text((w // 4 + 12, h // 4 + 12), "Daily reward!  [X]", fill=0)
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=85)  # JPEG: what a phone streams, and cheap to encode
    return out.getvalue()
