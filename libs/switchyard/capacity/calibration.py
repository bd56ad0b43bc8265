"""Calibrations of the `sim` engine for target GPUs, derived from the GPU presets.

The `sim` engine (`switchyard.engines.sim`) models one vLLM engine serving
Qwen2.5-VL-7B (`presets.MODELS["qwen2.5-vl-7b"]`). Its time model has five
hardware figures: a fixed CPU cost per engine step, the decode step's
weight-read time and per-sequence slope, the prefill cost of one token, and the
KV cache size. One GPU has a published measurement ([S0] §2.1-2.2: vLLM on one
A100, 50 concurrent requests, TTFT ~58 ms, TPOT 16.36 ms, TPOT +20 % from 10 to
50 concurrent; the engine module shows how these figures reproduce it). The
other GPUs have none (no public sm120 benchmark for the RTX 5090, the seeds'
hardware), so their figures are the A100's scaled by the hardware ratio that
bounds each term, with the planner's own formulas (`performance`, `memory`):

- decode is bandwidth-bound: one step reads the weights plus each sequence's KV,
  `decode_step_seconds` = (W + B x kv_tokens x KV bytes) / (bandwidth x eta_bw).
  From the A100 point: W = 8.29B x 2 bytes = 16.58 GB and `tpot_base` 11.95 ms
  give eta_bw = 16.58 GB / (2,039 GB/s x 11.95 ms) = 0.680; `tpot_per_seq`
  0.0683 ms at that efficiency is a read of 94.8 MB per sequence = ~3,300 fp8 KV
  tokens (KV reads plus attention's less efficient access, folded together).
  Both terms therefore scale as 2,039 / bandwidth.
- prefill is compute-bound: `prefill_seconds` = 2 x P x tokens / (FLOP/s x MFU).
  From the A100 point: 0.11 ms per token at 312 TFLOP/s gives MFU = 2 x 8.29e9 /
  (312e12 x 0.11e-3) = 0.483, counted over all 8.29B parameters (the vision
  encoder's cost on visual tokens is folded in: the calibration step's uncached
  tokens are mostly a frame). The cost scales as 312 / dense BF16 TFLOP/s (the
  FP32-accumulate figure on GeForce cards, see `presets`).
- the step's fixed cost (scheduler, sampler, detokenizer) runs on the CPU: 1 ms
  on every GPU.
- KV capacity is what `plan_memory` leaves: memory x 0.9 (vLLM's
  gpu_memory_utilization, as `VllmSettings` sets it) - 16.58 GB of weights - 4 GB
  of activations and workspace (`plan.DEFAULT_OVERHEAD_PER_GPU`), divided by
  28,672 bytes per token (28 layers x 4 KV heads x 128 dims x K and V x 1 byte:
  fp8 KV, `VllmSettings.kv_cache_dtype`).

| preset | GPU | tpot_base | tpot_per_seq | TPOT(50) | prefill/token | KV tokens |
| --- | --- | --- | --- | --- | --- | --- |
| `a100` | A100 80GB SXM | 11.95 ms | 0.0683 ms | 16.37 ms | 0.110 ms | 1,793,387 |
| `h100` | H100 80GB SXM | 7.27 ms | 0.0416 ms | 10.35 ms | 0.0347 ms | 1,793,387 |
| `rtx5090` | RTX 5090 32GB | 13.60 ms | 0.0777 ms | 18.48 ms | 0.164 ms | 286,690 |

What the scaling assumes, stated because the figures are worth no more: the
A100's efficiencies hold on the other cards (an H100 usually reaches a lower MFU
and a GDDR7 card a different eta_bw: measure and override), and the per-step
CPU cost does not shrink with a faster GPU (on an H100 it is 10 % of a step).
"""

from __future__ import annotations

import math
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

from switchyard.capacity.errors import CapacityInputError
from switchyard.capacity.memory import MemoryInput, kv_bytes_per_token, plan_memory
from switchyard.capacity.performance import Hardware, decode_step_seconds, prefill_seconds
from switchyard.capacity.plan import DEFAULT_OVERHEAD_PER_GPU
from switchyard.capacity.presets import GpuSpec, gpu_preset, model_preset

SimGpu = Literal["a100", "h100", "rtx5090"]
SIM_GPUS: tuple[SimGpu, ...] = get_args(SimGpu)

# The planner's GPU preset behind each sim preset.
GPU_OF: dict[SimGpu, str] = {"a100": "a100-80gb", "h100": "h100-80gb", "rtx5090": "rtx-5090"}
SIM_MODEL = "qwen2.5-vl-7b"

# The measured point ([S0] §2.1-2.2; `switchyard.engines.sim` derives these from it).
ANCHOR: SimGpu = "a100"
ANCHOR_STEP_OVERHEAD = 0.001  # s per step, CPU
ANCHOR_TPOT_BASE = 0.011_95  # s per step, weights read
ANCHOR_TPOT_PER_SEQ = 0.000_068_3  # s per step per sequence
ANCHOR_PREFILL_PER_TOKEN = 0.000_11  # s per uncached prompt token

WEIGHT_BYTES = 2  # BF16 weights
KV_BYTES = 1  # fp8 KV cache
GPU_MEMORY_UTILIZATION = 0.9


class SimCalibration(BaseModel):
    """The `sim` engine's hardware figures for one GPU (seconds, tokens)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    preset: SimGpu
    gpu: str  # the GPU preset's name
    step_overhead: float
    tpot_base: float
    tpot_per_seq: float
    prefill_cost_per_token: float
    kv_capacity_tokens: int

    def settings(self) -> dict[str, float | int]:
        """The `SimSettings` fields this calibration sets."""
        return self.model_dump(exclude={"preset", "gpu"})


def _weights_bytes() -> float:
    return model_preset(SIM_MODEL).params_b * 1e9 * WEIGHT_BYTES


def _kv_per_token() -> float:
    m = model_preset(SIM_MODEL)
    return kv_bytes_per_token(m.layers, m.kv_heads, m.head_dim, KV_BYTES)


def _anchor_gpu() -> GpuSpec:
    return gpu_preset(GPU_OF[ANCHOR])


def bw_efficiency() -> float:
    """eta_bw that makes the planner's decode step the anchor's `tpot_base`."""
    return _weights_bytes() / (_anchor_gpu().bandwidth_gbs * 1e9 * ANCHOR_TPOT_BASE)


def mfu() -> float:
    """MFU that makes the planner's prefill the anchor's per-token cost."""
    flops = 2 * model_preset(SIM_MODEL).params_b * 1e9
    return flops / (_anchor_gpu().dense_tflops * 1e12 * ANCHOR_PREFILL_PER_TOKEN)


def kv_read_tokens_per_seq() -> float:
    """KV tokens a step reads per sequence at eta_bw, so `tpot_per_seq` is the anchor's."""
    read = ANCHOR_TPOT_PER_SEQ * _anchor_gpu().bandwidth_gbs * 1e9 * bw_efficiency()
    return read / _kv_per_token()


def kv_capacity_tokens(gpu: GpuSpec) -> int:
    m = model_preset(SIM_MODEL)
    mem = plan_memory(
        MemoryInput(
            gpu_mem=gpu.memory_gb, util=GPU_MEMORY_UTILIZATION,
            overhead=DEFAULT_OVERHEAD_PER_GPU, params_b=m.params_b, weight_bytes=WEIGHT_BYTES,
            layers=m.layers, kv_heads=m.kv_heads, head_dim=m.head_dim, kv_bytes=KV_BYTES,
            context=1,
        )
    )  # fmt: skip
    return max(1, math.floor(mem.kv_budget_bytes / mem.kv_bytes_per_token))


def sim_calibration(name: str) -> SimCalibration:
    """The calibration of preset `name` (one of `SIM_GPUS`); see the module docstring."""
    preset = next((p for p in SIM_GPUS if p == name.lower()), None)
    if preset is None:
        raise CapacityInputError(
            f"unknown sim GPU preset {name!r}; choose one of {', '.join(SIM_GPUS)}"
        )
    gpu = gpu_preset(GPU_OF[preset])
    hw = Hardware(
        bandwidth_gbs=gpu.bandwidth_gbs, dense_tflops=gpu.dense_tflops,
        bw_efficiency=bw_efficiency(), mfu=mfu(),
    )  # fmt: skip
    per_token = _kv_per_token()
    per_seq = decode_step_seconds(hw, 0, per_token, 1, 1) * kv_read_tokens_per_seq()
    return SimCalibration(
        preset=preset,
        gpu=gpu.name,
        step_overhead=ANCHOR_STEP_OVERHEAD,
        # Rounded to the nanosecond: the anchor's own figures come back exactly.
        tpot_base=round(decode_step_seconds(hw, _weights_bytes(), per_token, 0, 0), 9),
        tpot_per_seq=round(per_seq, 9),
        prefill_cost_per_token=round(prefill_seconds(hw, model_preset(SIM_MODEL).params_b, 1), 9),
        kv_capacity_tokens=kv_capacity_tokens(gpu),
    )
