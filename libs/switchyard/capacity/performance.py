"""Speed from first principles: decode reads memory, prefill does arithmetic ([S2] §3.1, [S4] §2).

Decode: every step reads all weights once plus the KV cache of every sequence in
the batch, so a step takes

    t_step(B) = (weights + B × kv_tokens × KV bytes/token) / (bandwidth × η_bw)

and each of the B sequences gains one token: TPOT = t_step, throughput = B / t_step.

Prefill: about 2 × P FLOPs per prompt token (one multiply-add per parameter), so

    t_prefill(n) = 2 × P × n / (FLOPs × MFU)

Assumptions, stated because they are what the estimate is worth:
- η_bw (default 0.6) and MFU (default 0.4) are the efficiencies [S2] §3.1 uses; real
  engines differ by kernel, batch and GPU, so both are parameters — measure and pass them.
- KV read per sequence = its full context (an upper bound: a sequence grows to it).
- Tensor parallel scales bandwidth and FLOPs with the GPU count and the all-reduce is
  free: true enough over NVLink, optimistic over PCIe (see `interconnect`).
- Prefill and decode share the GPU; attention FLOPs (quadratic in context), the vision
  encoder, sampling and scheduling are not counted.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from switchyard.capacity.units import GB, TB

DEFAULT_BW_EFFICIENCY = 0.6
DEFAULT_MFU = 0.4


class Hardware(BaseModel):
    """The compute one replica has: per-GPU figures times the GPUs in the replica."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bandwidth_gbs: float = Field(gt=0, description="per GPU, 10^9 B/s")
    dense_tflops: float = Field(gt=0, description="per GPU, dense BF16")
    gpus: int = Field(1, ge=1)
    bw_efficiency: float = Field(DEFAULT_BW_EFFICIENCY, gt=0, le=1)
    mfu: float = Field(DEFAULT_MFU, gt=0, le=1)

    @property
    def effective_bandwidth(self) -> float:
        """Bytes per second a decode step really gets."""
        return self.bandwidth_gbs * GB * self.gpus * self.bw_efficiency

    @property
    def effective_flops(self) -> float:
        return self.dense_tflops * TB * self.gpus * self.mfu


def decode_step_seconds(
    hw: Hardware, weights_bytes: float, kv_bytes_per_token: float, batch: int, kv_tokens: int
) -> float:
    """One decode step (= TPOT) for `batch` sequences of `kv_tokens` each."""
    read = weights_bytes + batch * kv_tokens * kv_bytes_per_token
    return read / hw.effective_bandwidth


def decode_tokens_per_second(
    hw: Hardware, weights_bytes: float, kv_bytes_per_token: float, batch: int, kv_tokens: int
) -> float:
    if batch < 1:
        return 0.0
    return batch / decode_step_seconds(hw, weights_bytes, kv_bytes_per_token, batch, kv_tokens)


def prefill_seconds(hw: Hardware, params_b: float, tokens: float) -> float:
    """Compute-bound prefill of `tokens` uncached prompt tokens."""
    return 2 * params_b * 1e9 * tokens / hw.effective_flops


def max_batch_for_tpot(
    hw: Hardware, weights_bytes: float, kv_bytes_per_token: float, kv_tokens: int, tpot_s: float
) -> int:
    """Largest batch whose decode step stays within `tpot_s` (0: not even one)."""
    room = tpot_s * hw.effective_bandwidth - weights_bytes
    if room < 0:
        return 0
    return math.floor(room / (kv_tokens * kv_bytes_per_token) + 1e-9)
