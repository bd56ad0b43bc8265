"""Time what the `sim` engine models, on a real GPU: GEMMs and one Qwen3-VL-8B forward pass.

The sim's calibrations (`switchyard.capacity.calibration`) are derived from published
figures, not measured on our cards. This script measures the terms they model, on one GPU
with PyTorch and transformers only (no vLLM, no weights: the model is randomly initialised,
which costs the same FLOPs as the real one), and prints them beside the sim's preset:

- dense GEMMs at Qwen3-VL-8B's shapes: prefill (one frame's tokens x hidden -> the
  attention and MLP projections) and decode (a batch of one-token rows), in BF16 and, where
  the card has FP8 tensor cores, FP8 (`torch._scaled_mm`, per-tensor scales, BF16 out:
  what vLLM's W8A8 FP8 path runs); achieved TFLOP/s and, for decode, GB/s of weights read;
- one forward pass of a random Qwen3-VL-8B (transformers, SDPA attention) on one 1280x704
  frame (44 x 80 patches of 16 px = 3,520 patches -> 880 visual tokens after the 2x2
  merge): the vision encoder alone, the whole prefill, and one decode step on its KV.

It must finish in under 5 minutes on an H100 (model init ~20 s, the rest ~1 min). Usage,
from the repository root on the GPU machine:

    python deploy/gpu/calibrate.py --json "$OUT/calibrate.json"

`--smoke` runs the same code on tiny shapes (any device, CPU included): the test of this
script (tests/vllm/test_calibrate_script.py) runs it so, where transformers and torch are.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Qwen3-VL-8B-Instruct's config.json (huggingface.co/Qwen/Qwen3-VL-8B-Instruct): the text
# model is Qwen3-8B's shape, the vision tower transformers' Qwen3VLVisionConfig defaults
# with out_hidden_size = the text hidden size.
TEXT = {
    "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "rope_parameters": {"rope_type": "default", "rope_theta": 5_000_000,
                                              "mrope_section": [24, 20, 20],
                                              "mrope_interleaved": True},
}  # fmt: skip
VISION = {
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
    "out_hidden_size": 4096, "deepstack_visual_indexes": [8, 16, 24],
}  # fmt: skip
# The same architecture at toy size, for --smoke.
SMOKE_ROPE = {**TEXT["rope_parameters"], "mrope_section": [2, 3, 3]}  # sums to head_dim / 2
SMOKE_TEXT = {**TEXT, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "vocab_size": 152000, "rope_parameters": SMOKE_ROPE}  # fmt: skip
SMOKE_VISION = {**VISION, "depth": 2, "hidden_size": 32, "intermediate_size": 64,
                "num_heads": 2, "out_hidden_size": 64, "deepstack_visual_indexes": [0]}  # fmt: skip
IMAGE_TOKEN_ID = 151655  # Qwen3VLConfig.image_token_id
FRAME_GRID = (1, 44, 80)  # t, h, w patches of a 1280x704 frame (16 px patches)
SMOKE_GRID = (1, 4, 6)
TEXT_TOKENS = 120  # system prompt, goal and history around the frame: a window step's text
DECODE_BATCHES = (16, 64)  # _scaled_mm wants every dimension a multiple of 16


def timed(fn: Callable[[], object], device: torch.device, repeat: int) -> float:
    """Median seconds of `fn` over `repeat` runs after two warm-up runs."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        fn()
    sync()
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def gemm_shapes(text: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(K, N) of one decoder layer's projections: fused QKV, O, fused gate+up, down."""
    h, heads, kv, d = (text[k] for k in ("hidden_size", "num_attention_heads",
                                         "num_key_value_heads", "head_dim"))  # fmt: skip
    ff = text["intermediate_size"]
    return {"qkv": (h, (heads + 2 * kv) * d), "o": (heads * d, h), "gate_up": (h, 2 * ff),
            "down": (ff, h)}  # fmt: skip


def has_fp8(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def time_gemms(
    text: dict[str, Any], rows: dict[str, int], device: torch.device, repeat: int
) -> list[dict[str, Any]]:
    """Each projection at each row count, BF16 and (where the card has it) FP8."""
    out = []
    for stage, m in rows.items():
        for name, (k, n) in gemm_shapes(text).items():
            a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
            flops, weight_bytes = 2 * m * k * n, k * n
            row: dict[str, Any] = {"stage": stage, "gemm": name, "m": m, "k": k, "n": n}
            s = timed(lambda a=a, w=w: a @ w.t(), device, repeat)
            row["bf16_s"], row["bf16_tflops"] = s, flops / s / 1e12
            row["bf16_weight_gbs"] = 2 * weight_bytes / s / 1e9
            if has_fp8(device):
                a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                one = torch.ones((), device=device, dtype=torch.float32)
                try:
                    s8 = timed(lambda a8=a8, w8=w8, one=one: torch._scaled_mm(
                        a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                        device, repeat)  # fmt: skip
                except RuntimeError as exc:  # a shape this torch's FP8 kernels refuse: say so
                    row["fp8_error"] = str(exc).splitlines()[0]
                else:
                    row["fp8_s"], row["fp8_tflops"] = s8, flops / s8 / 1e12
                    row["fp8_weight_gbs"] = weight_bytes / s8 / 1e9
            out.append(row)
            del a, w
    return out


def build_model(smoke: bool, device: torch.device) -> Any:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    config = Qwen3VLConfig(
        text_config=SMOKE_TEXT if smoke else TEXT,
        vision_config=SMOKE_VISION if smoke else VISION,
        image_token_id=IMAGE_TOKEN_ID,
    )
    config._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration(config).to(dtype)
    return model.eval()


def time_forward(smoke: bool, device: torch.device, repeat: int) -> dict[str, Any]:
    """The vision encoder on one frame, the whole prefill of a step, one decode step."""
    started = time.perf_counter()
    model = build_model(smoke, device)
    init_s = time.perf_counter() - started
    vision = model.config.vision_config
    t, h, w = SMOKE_GRID if smoke else FRAME_GRID
    patch_dim = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    dtype = next(model.parameters()).dtype
    pixels = torch.randn(t * h * w, patch_dim, device=device, dtype=dtype)
    grid = torch.tensor([[t, h, w]], device=device)
    visual = t * h * w // vision.spatial_merge_size**2
    text = 8 if smoke else TEXT_TOKENS
    ids = torch.full((1, text + visual), 100, device=device, dtype=torch.long)
    ids[0, text // 2 : text // 2 + visual] = IMAGE_TOKEN_ID
    out: dict[str, Any] = {"init_s": init_s, "patches": t * h * w, "visual_tokens": visual,
                           "prompt_tokens": ids.shape[1]}  # fmt: skip
    with torch.inference_mode():
        out["encoder_s"] = timed(lambda: model.model.visual(pixels, grid_thw=grid), device, repeat)

        # transformers >= 5 wants the token types for M-RoPE (text 0, image 1); older
        # versions find the image tokens themselves and take no such argument.
        extra: dict[str, Any] = {}
        if "mm_token_type_ids" in inspect.signature(model.forward).parameters:
            extra["mm_token_type_ids"] = (ids == IMAGE_TOKEN_ID).int()

        def prefill() -> Any:
            return model(input_ids=ids, pixel_values=pixels, image_grid_thw=grid,
                         use_cache=True, **extra)  # fmt: skip

        out["prefill_s"] = timed(prefill, device, repeat)
        past = prefill().past_key_values
        step = torch.full((1, 1), 100, device=device, dtype=torch.long)

        def decode() -> Any:
            # One token on the prompt's cache (positions from the prefill's rope deltas),
            # cropped back after so every run decodes at the same length.
            result = model(input_ids=step, past_key_values=past, use_cache=True)
            past.crop(-1)
            return result

        out["decode_step_s"] = timed(decode, device, repeat)
    out["llm_prefill_s"] = max(0.0, out["prefill_s"] - out["encoder_s"])
    out["params_b"] = sum(p.numel() for p in model.parameters()) / 1e9
    return out


def sim_preset(name: str) -> dict[str, Any] | None:
    """The sim's calibration for `name`, when this checkout's library imports here."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "libs"))
    try:
        from switchyard.capacity.calibration import sim_calibration
    except ImportError as exc:  # e.g. no pydantic on the GPU machine: print ours alone
        return {"unavailable": str(exc)}
    return sim_calibration(name).model_dump()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, any device")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", default="h100", help="the sim preset to print beside")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    text = SMOKE_TEXT if args.smoke else TEXT
    visual = (lambda t, h, w: t * h * w // 4)(*(SMOKE_GRID if args.smoke else FRAME_GRID))
    rows = {"prefill": visual + (8 if args.smoke else TEXT_TOKENS)}
    rows |= {f"decode-b{b}": b for b in DECODE_BATCHES}
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "smoke": args.smoke,
        "gemms": time_gemms(text, rows, device, args.repeat),
        "forward": time_forward(args.smoke, device, args.repeat),
        "sim_preset": {args.preset: sim_preset(args.preset)},
    }  # fmt: skip
    for g in report["gemms"]:
        fp8 = f"  fp8 {g['fp8_tflops']:7.1f} TFLOP/s" if "fp8_tflops" in g else ""
        shape = f"{g['stage']:>10} {g['gemm']:>8} {g['m']:>5}x{g['k']}x{g['n']}"
        bf16 = f"bf16 {g['bf16_tflops']:7.1f} TFLOP/s {g['bf16_weight_gbs']:7.0f} GB/s"
        print(f"{shape}: {bf16}{fp8}")
    f = report["forward"]
    print(f"forward ({f['params_b']:.2f}B params, {f['patches']} patches, "
          f"{f['prompt_tokens']} prompt tokens): encoder {f['encoder_s'] * 1e3:.1f} ms, "
          f"prefill {f['prefill_s'] * 1e3:.1f} ms (LLM {f['llm_prefill_s'] * 1e3:.1f} ms), "
          f"decode step {f['decode_step_s'] * 1e3:.2f} ms; init {f['init_s']:.1f} s")  # fmt: skip
    print(f"sim preset {args.preset}: {json.dumps(report['sim_preset'][args.preset])}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
