"""Per-model VLM geometry: how a model tiles a frame into visual tokens, how it writes points.

Two things of the agent path depend on the model behind the pool, and nothing
else does: the size of one visual token (the preprocessor resizes frames to
whole tokens, `agentprompt.fit`, and every estimate counts them,
`agentprompt.visual_tokens`), and the coordinate convention of its answers
(the worker maps them back to the phone's pixels, `agentprompt.Geometry`;
the system prompt tells the model which one to use). A `VlmProfile` holds
both; the preprocessor picks it with `SY_AGENT_VLM`, records its name on every
request (`FrameGeometry.vlm`) so the worker maps with the convention the
prompt asked for and never guesses, and the sim engine simulates one
(`SY_SIM_VLM`; say the same there).

What the two profiles are, checked in the sources:

`qwen2.5-vl` (Qwen2.5-VL): 14 px patches merged 2x2, so one visual token per
28x28 square; the released checkpoints' `preprocessor_config.json` has
`min_pixels` 3136 (56x56) and `max_pixels` 12845056, `patch_size` 14,
`merge_size` 2 (as mirrored at huggingface.co/mlx-community/
Qwen2.5-VL-3B-Instruct-4bit and coder3101/Qwen2.5-VL-72B-Instruct-heretic); the
transformers `Qwen2VLImageProcessor` itself defaults to 56x56 and 28*28*1280
(src/transformers/models/qwen2_vl/image_processing_qwen2_vl.py), which is
what `VllmSettings.max_pixels` passes to vLLM. It answers in absolute pixels of the
*resized* image: the Qwen2.5-VL mobile-agent cookbook tells the model "The
screen's resolution is WxH" with W, H from `smart_resize`, and draws the
answer on the resized image (github.com/QwenLM/Qwen3-VL, cookbooks/
mobile_agent.ipynb at f61c3cd, January 2025, before the Qwen3-VL rewrite).

`qwen3-vl` (Qwen3-VL, e.g. the seeds' Qwen3-VL-8B): 16 px patches merged 2x2,
so 32 px per side of a visual token:
- transformers `Qwen3VLVisionConfig` defaults `patch_size=16`,
  `spatial_merge_size=2` (src/transformers/models/qwen3_vl/
  configuration_qwen3_vl.py);
- vLLM's `Qwen3VLProcessingInfo._get_vision_info` resizes with
  `smart_resize(factor=patch_size * merge_size, min_pixels=size["shortest_edge"],
  max_pixels=size["longest_edge"])` and counts `(h/16)*(w/16) // 2**2` tokens
  (vllm/model_executor/models/qwen3_vl.py);
- the checkpoints' `preprocessor_config.json`: `patch_size` 16, `merge_size`
  2, `size` {"shortest_edge": 65536, "longest_edge": 16777216}, i.e. min
  pixels 256x256 and max pixels 4096x4096 (Qwen3-VL-8B-Instruct's, as mirrored
  at huggingface.co/cdreetz/Qwen3-VL-8B-Instruct);
- the Qwen3-VL README: "the compression ratio is 32 for Qwen3-VL",
  `image_patch_size` "14 for Qwen2.5-VL and 16 for Qwen3-VL", sizes "rounded
  to the nearest multiple of 32 (32 for Qwen3VL, 28 for Qwen2.5VL)"
  (github.com/QwenLM/Qwen3-VL, README.md).
It answers in *relative* coordinates, 0-1000 on each axis, whatever the
image's size: "Qwen3-VL's default coordinate system has been changed from the
absolute coordinates used in Qwen2.5-VL to relative coordinates ranging from 0
to 1000" and points map back as `int(x / 1000 * width)` (cookbooks/
2d_grounding.ipynb; README: "Using relative position coordinates"; cookbooks/
omni_recognition.ipynb: "the coordinates are scaled from 0 to 1000").
A caveat, from the same repository: its Qwen3-VL mobile-agent cookbook
declares "The screen's resolution is 999x999" and maps back with
`round(x / 999 * width)`, and issue QwenLM/Qwen3-VL#1741 asks whether the
range is 0-999 or 0-1000 (Alibaba's API docs say 0-999). We follow the
grounding cookbook (/1000, floor), admit 1000 itself and clamp it to the last
pixel: the two readings differ by at most 0.1 % of a side (1 px at 1080).

Why resizing to whole tokens matters: vLLM's `smart_resize` leaves a frame
whose sides are multiples of the factor and whose area is within its min/max
pixels exactly as it is, so the model sees the preprocessor's frame, and its
pixel answers are in that frame. Relative answers do not depend on the size at
all; there the profile's patch only decides the token count. `fit` never
upscales, so a frame below a profile's `default_min_pixels` (256x256 for
Qwen3-VL) would be upscaled by the engine: harmless for relative answers, and
phone frames are far larger anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

VlmName = Literal["qwen2.5-vl", "qwen3-vl"]
Coords = Literal["pixels", "relative-1000"]
VLM_NAMES: tuple[VlmName, ...] = get_args(VlmName)
# The seeds' model, Qwen3-VL-8B: the profile under which the agent serves the most phones
# (README, "Agent steps"); a Qwen2.5-VL pool sets SY_AGENT_VLM / SY_SIM_VLM=qwen2.5-vl.
DEFAULT_VLM: VlmName = "qwen3-vl"
# A relative coordinate's full scale: 0 is the top/left edge, RELATIVE_SCALE the bottom/right.
RELATIVE_SCALE = 1000


@dataclass(frozen=True)
class VlmProfile:
    name: VlmName
    patch_px: int  # px per side of one visual token (patch_size x spatial_merge_size)
    coords: Coords  # how the model writes a point: resized-frame pixels or 0-1000
    # The checkpoints' processor defaults (`preprocessor_config.json`): what the engine
    # resizes a frame into when nothing says otherwise.
    default_max_pixels: int
    default_min_pixels: int


PROFILES: dict[VlmName, VlmProfile] = {
    "qwen2.5-vl": VlmProfile("qwen2.5-vl", 28, "pixels", 12_845_056, 3_136),
    "qwen3-vl": VlmProfile("qwen3-vl", 32, "relative-1000", 16_777_216, 65_536),
}


def vlm_profile(name: str) -> VlmProfile:
    """The profile called `name`; ValueError names the known ones."""
    try:
        return PROFILES[name]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"unknown VLM profile {name!r}: one of {', '.join(VLM_NAMES)}") from None
