"""Calibrations of the `sim` engine: a model's shapes on one GPU's own figures, per precision.

The `sim` engine (`switchyard.engines.sim`) models one vLLM engine serving one
model (`SimModel`: Qwen3-VL-8B by default, the seeds' model; Qwen2.5-VL-7B, the
model of the one measured point) on one GPU (`SimGpu`) in one precision
(`Precision`: `bf16`, or `fp8` = W8A8: FP8 weights and FP8 tensor math for the
matmuls; the KV cache is fp8 in both, as `VllmSettings.kv_cache_dtype` sets it).
Every figure comes from three sources, each cited where it is defined below:

1. the model's shapes (`presets.MODELS`, from its config.json);
2. the card's datasheet figures (`presets.GPUS`): dense BF16 with FP32 accumulate
   (the mode vLLM's kernels use), dense FP8 where the card has it (none on the
   A100), memory bandwidth and memory;
3. an efficiency per stage (`EFFICIENCY`): MFU of the vision encoder and of LLM
   prefill, bandwidth efficiency of decode, each measured or labelled as this
   project's estimate.

The time model (seconds; `SimSettings` holds the figures):

- decode step = step_overhead + tpot_base + tpot_per_seq x B. tpot_base reads
  the language model's weights once: its layers' matmuls at the precision's
  bytes, plus the LM head in BF16 (vLLM's fp8 leaves it unquantized; the
  embedding is a lookup, the vision encoder is not run): (bytes) / (bandwidth x
  eta_bw). tpot_per_seq is the anchor's per-sequence read (~3,300 KV tokens,
  reads plus attention's less efficient access folded together) at this model's
  KV bytes per token: 2 x layers x KV heads x head dim x 1 byte (fp8).
- prefill of a chunk of n uncached tokens at positions p..p+n-1 =
  n x prefill_cost_per_token + prefill_attn_cost x (sum of positions):
  2 x (layer matmul params) FLOPs a token at the precision's peak x MFU, plus
  causal attention, 4 x layers x heads x head dim FLOPs per (token, earlier
  token), in BF16 (the attention kernels do not run FP8 here).
- the vision encoder, once per frame whose tokens are not cached, over its N
  patches (tokens x merge^2): encoder_cost_per_patch x N + encoder_attn_cost x
  N^2: the ViT blocks' matmuls, the patch embedding and the mergers (over N /
  merge^2 merged patches), plus full attention, 4 x depth x hidden FLOPs per
  patch pair (quadratic: Qwen3-VL's ViT has no windows).
- KV capacity = memory x 0.9 (gpu_memory_utilization, as `VllmSettings` sets it)
  - weights (BF16, or FP8 for the matmul weights of the LLM and the encoder)
  - 4 GB (`plan.DEFAULT_OVERHEAD_PER_GPU`), over the KV bytes per token.

A model without shapes (`qwen2.5-vl-7b`: the anchor's) is the folded model: a
token costs 2 x all parameters (the encoder's cost on visual tokens folded in, as
the anchor measured it), every parameter is read per decode step, and no
encoder or attention term is added. On the A100 in BF16 it is exactly [S0]'s
measured point (`engines.sim` derives the figures).

The efficiencies (`EFFICIENCY`, one row per card; MFU is a fraction of the
precision's own peak):

| card | BF16 / FP8 TFLOPS | GB/s | GB | MFU encoder | MFU prefill | eta_bw |
| --- | --- | --- | --- | --- | --- | --- |
| `a100` | 312 / - | 2,039 | 80 | 0.160 (b) | 0.483 (a) | 0.680 (a) |
| `h100` | 989 / 1,979 | 3,350 | 80 | 0.0985 (c) | 0.297 (c) | 0.680 (e) |
| `rtx5090` | 209.5 / 419 | 1,792 | 32 | 0.160 (b) | 0.483 (d) | 0.680 (e) |

(a) [S0]'s A100 point (`ANCHOR_*`, derivation in `engines.sim`): MFU 0.483 and
eta_bw 0.680, measured. (b) the A100's prefill MFU x the encoder/prefill MFU
ratio the H100 timing shows (0.0985 / 0.297 = 0.332): this project's estimate.
(c) vllm-project/vllm#41267 (vLLM 0.19.1, Qwen2.5-VL-7B, one H100 80GB, one
1080p image, max_tokens 1): prefill 0.126 s for 2,718 prompt tokens, encoder
0.167 s (the rest of the 0.293 s TTFT, so CPU preprocessing is in it too: the
encoder figure is a floor). (d) this project's estimate: the A100's, since a
single frame's prefill fills a card of the 5090's size (170 SMs, 209.5 TFLOPS)
at least as well as an A100's (108 SMs, 312), better than an H100 (132 SMs, 989
TFLOPS: 0.297); its GEMMs reach their spec (torch.matmul BF16 224 TFLOPS =
1.07 x 209.5, main-horse.github.io/posts/5090-mm-perf). (e) this project's
estimate: the A100's measured eta_bw (no public decode timing of these cards).
FP8 assumes the same MFU of the FP8 peak as BF16 reaches of its own: an estimate
(the GEMMs of the device check, deploy/gpu, would measure it).

The figures this gives (`sim_calibration(gpu, model, precision)`; ms; "encoder" for
one 1280x720 frame, 3,520 patches; "frame" = `frame_seconds`; fps = 1 / frame):

| preset | model | prec. | tpot_base | per seq | prefill/token | encoder | frame | fps | KV tokens |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
| `a100` | qwen2.5-vl-7b | bf16 | 11.95 | 0.0683 | 0.1100 | - | 124.0 | 8.07 | 1,793,387 |
| `a100` | qwen3-vl-8b | bf16 | 10.91 | 0.1756 | 0.0922 | 94.6 | 177.4 | 5.64 | 684,407 |
| `h100` | qwen3-vl-8b | bf16 | 6.64 | 0.1069 | 0.0473 | 48.6 | 91.1 | 10.98 | 684,407 |
| `h100` | qwen3-vl-8b | fp8 | 3.59 | 0.1069 | 0.0236 | 32.2 | 53.8 | 18.58 | 786,391 |
| `rtx5090` | qwen3-vl-8b | bf16 | 12.41 | 0.1998 | 0.1373 | 140.9 | 264.2 | 3.78 | 98,470 |
| `rtx5090` | qwen3-vl-8b | fp8 | 6.72 | 0.1998 | 0.0686 | 93.4 | 156.2 | 6.40 | 200,453 |

(`frame_seconds`: the encoder plus the prefill of one frame's 882 uncached
tokens at the start of a prompt; fps is what one GPU serves at 100 % busy, the
ceiling `sy plan` reports and the sim reproduces within 10 %, tests/unit/
test_capacity_calibration.py. The qwen2.5-vl-7b frame is 1,125 tokens of 28 px.)
"""

from __future__ import annotations

import math
from typing import Literal, Protocol, TypeVar, get_args

from pydantic import BaseModel, ConfigDict

from switchyard.agentprompt import fit
from switchyard.capacity.errors import CapacityInputError
from switchyard.capacity.memory import kv_bytes_per_token
from switchyard.capacity.plan import DEFAULT_OVERHEAD_PER_GPU
from switchyard.capacity.presets import GpuSpec, ModelSpec, gpu_preset, model_preset
from switchyard.capacity.units import GB, TB

SimGpu = Literal["a100", "h100", "rtx5090"]
SIM_GPUS: tuple[SimGpu, ...] = get_args(SimGpu)
SimModel = Literal["qwen3-vl-8b", "qwen2.5-vl-7b"]
SIM_MODELS: tuple[SimModel, ...] = get_args(SimModel)
# The seeds' model ([S0] intro, 2.1-2.5: Qwen3-VL-8B on RTX 5090s).
DEFAULT_SIM_MODEL: SimModel = "qwen3-vl-8b"
Precision = Literal["bf16", "fp8"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)

# The planner's GPU preset behind each sim preset.
GPU_OF: dict[SimGpu, str] = {"a100": "a100-80gb", "h100": "h100-80gb", "rtx5090": "rtx-5090"}

# The measured point ([S0] §2.1-2.2; `switchyard.engines.sim` derives these from it):
# Qwen2.5-VL-7B (folded), one A100, BF16.
ANCHOR: SimGpu = "a100"
ANCHOR_MODEL: SimModel = "qwen2.5-vl-7b"
ANCHOR_STEP_OVERHEAD = 0.001  # s per step, CPU
ANCHOR_TPOT_BASE = 0.011_95  # s per step, weights read
ANCHOR_TPOT_PER_SEQ = 0.000_068_3  # s per step per sequence
ANCHOR_PREFILL_PER_TOKEN = 0.000_11  # s per uncached prompt token

WEIGHT_BYTES: dict[Precision, int] = {"bf16": 2, "fp8": 1}
KV_BYTES = 1  # fp8 KV cache in both precisions (`VllmSettings.kv_cache_dtype`)
GPU_MEMORY_UTILIZATION = 0.9
# GB/s one way between two GPUs of one server, what a prefill stage's KV crosses to its
# decode stage (#39). A100/H100 SXM: NVLink, half the bidirectional 600/900 GB/s of their
# datasheets (presets.GPUS). RTX 5090: GeForce drivers offer no peer-to-peer, so the KV is
# staged through host memory: ~24 GB/s one way measured between two 5090s with P2P off
# (~28 GB/s with a patched P2P driver; PCIe 5.0 x8; wumeicn.com, "NVIDIA RTX 5090 P2P
# Support Enabled by Patched Driver", 2025); at x16 with P2P writes 5090s reach ~56 GB/s
# same-NUMA and ~51 GB/s cross-NUMA (voipmonitor/rtx6kpro hardware/pcie-bandwidth.md), so
# the seeds' PIX/NODE/SYS classes differ by ~10 %, less than the P2P-off penalty: the sim
# takes the measured P2P-off figure for every pair.
KV_LINK_GBS: dict[SimGpu, float] = {"a100": 300.0, "h100": 450.0, "rtx5090": 24.0}

# vllm-project/vllm#41267 (see the module docstring, (c)): one H100, Qwen2.5-VL-7B, a
# 1920x1080 image = 1932x1092 after smart_resize (factor 28) = 2,691 visual tokens of
# 10,764 patches, 2,718 prompt tokens. LLM: 6.53B layer matmul params (Qwen2.5-7B: 28 x
# (2 x 3584^2 + 2 x 3584 x 512 + 3 x 3584 x 18944)); 2 x 6.53e9 x 2,718 + causal attention
# 4 x 28 x 3584 x 2,718^2 / 2 = 36.95 TFLOP in 0.126 s = 293 TFLOP/s = 0.297 of 989.
# Encoder (Qwen2.5-VL ViT: depth 32, hidden 1280, SwiGLU 3420, 4 full-attention blocks,
# the rest 112-px windows of 64 patches; merger 5120 -> 5120 -> 3584): 13.80 TFLOP of
# matmuls + 2.37 full attention + 0.10 windowed = 16.27 TFLOP in 0.167 s = 0.0985 of 989.
H100_PREFILL_MFU = 0.297
H100_ENCODER_MFU = 0.0985


class Efficiency(BaseModel):
    """How much of a card's peak each stage reaches (see the module docstring's table)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    encoder_mfu: float
    prefill_mfu: float
    bw_efficiency: float
    source: str


def _gpu(preset: SimGpu) -> GpuSpec:
    return gpu_preset(GPU_OF[preset])


def anchor_bw_efficiency() -> float:
    """eta_bw that makes the folded anchor's decode step the anchor's `tpot_base`."""
    weights = model_preset(ANCHOR_MODEL).params_b * 1e9 * WEIGHT_BYTES["bf16"]
    return weights / (_gpu(ANCHOR).bandwidth_gbs * GB * ANCHOR_TPOT_BASE)


def anchor_mfu() -> float:
    """MFU that makes the folded anchor's prefill the anchor's per-token cost."""
    flops = 2 * model_preset(ANCHOR_MODEL).params_b * 1e9
    return flops / (_gpu(ANCHOR).dense_tflops * TB * ANCHOR_PREFILL_PER_TOKEN)


def _efficiencies() -> dict[SimGpu, Efficiency]:
    mfu, eta = anchor_mfu(), anchor_bw_efficiency()
    encoder_ratio = H100_ENCODER_MFU / H100_PREFILL_MFU  # (b): one measured ratio, transferred
    return {
        "a100": Efficiency(
            encoder_mfu=mfu * encoder_ratio, prefill_mfu=mfu, bw_efficiency=eta,
            source="[S0] A100 point (prefill, decode); encoder: x vllm#41267's ratio (estimate)",
        ),
        "h100": Efficiency(
            encoder_mfu=H100_ENCODER_MFU, prefill_mfu=H100_PREFILL_MFU, bw_efficiency=eta,
            source="vllm-project/vllm#41267 (encoder, prefill); eta_bw: the A100's (estimate)",
        ),
        "rtx5090": Efficiency(
            encoder_mfu=mfu * encoder_ratio, prefill_mfu=mfu, bw_efficiency=eta,
            source="this project's estimate: the A100's efficiencies (module docstring (d), (e))",
        ),
    }  # fmt: skip


EFFICIENCY: dict[SimGpu, Efficiency] = _efficiencies()

# The frame whose cost defines a GPU's frames/s at 100 % busy (`frame_seconds`): a
# 1280x720 phone frame as the preprocessor resizes it for the model's 32 px tokens.
FRAME_WIDTH, FRAME_HEIGHT = 1280, 720
_VISION_MARKERS = 2  # <|vision_start|>, <|vision_end|>: uncached with the frame


class SimCalibration(BaseModel):
    """The `sim` engine's hardware figures for one GPU, model and precision (s, tokens)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    preset: SimGpu
    gpu: str  # the GPU preset's name
    model: SimModel
    precision: Precision
    step_overhead: float
    tpot_base: float
    tpot_per_seq: float
    prefill_cost_per_token: float
    prefill_attn_cost: float  # s per (prefilled token, earlier token in its prompt)
    encoder_cost_per_patch: float  # s per patch of an uncached frame
    encoder_attn_cost: float  # s per (patch, patch) pair of that frame
    kv_capacity_tokens: int
    kv_bytes_per_token: int  # what a KV handoff moves per prompt token (`KV_BYTES` each)
    kv_link_gbs: float  # the GPU-to-GPU link a handoff crosses (`KV_LINK_GBS`)

    def settings(self) -> dict[str, float | int]:
        """The `SimSettings` fields this calibration sets."""
        return self.model_dump(exclude={"preset", "gpu", "model", "precision"})


def peak_flops(gpu: GpuSpec, precision: Precision) -> float:
    """The dense tensor FLOP/s of `precision` on `gpu`; fp8 on a card without it is refused."""
    if precision == "bf16":
        return gpu.dense_tflops * TB
    if gpu.fp8_tflops is None:
        raise CapacityInputError(
            f"{gpu.name} has no FP8 tensor math: precision fp8 needs an H100 or an RTX 5090 "
            "(precision bf16 runs everywhere)"
        )
    return gpu.fp8_tflops * TB


def decode_weight_bytes(m: ModelSpec, precision: Precision) -> float:
    """Bytes one decode step reads: the LLM's matmul weights + its LM head (BF16)."""
    layers = m.layer_params
    if layers is None or m.vocab is None or m.hidden is None:
        return m.params_b * 1e9 * WEIGHT_BYTES[precision]
    return layers * WEIGHT_BYTES[precision] + m.vocab * m.hidden * WEIGHT_BYTES["bf16"]


def memory_weight_bytes(m: ModelSpec, precision: Precision) -> float:
    """Bytes the weights take: FP8 for the LLM's and the encoder's matmuls, BF16 the rest."""
    total = m.params_b * 1e9
    quantized = (m.layer_params or 0) + (m.vision.params if m.vision else 0)
    if m.layer_params is None:
        quantized = int(total)  # the folded model: every parameter at the precision
    return (total - quantized) * WEIGHT_BYTES["bf16"] + quantized * WEIGHT_BYTES[precision]


def kv_per_token(m: ModelSpec) -> float:
    return kv_bytes_per_token(m.layers, m.kv_heads, m.head_dim, KV_BYTES)


def kv_read_tokens_per_seq() -> float:
    """KV tokens a step reads per sequence at the anchor's eta_bw (its `tpot_per_seq`)."""
    read = ANCHOR_TPOT_PER_SEQ * _gpu(ANCHOR).bandwidth_gbs * GB * anchor_bw_efficiency()
    return read / kv_per_token(model_preset(ANCHOR_MODEL))


def kv_capacity_tokens(gpu: GpuSpec, m: ModelSpec, precision: Precision) -> int:
    budget = gpu.memory_gb * GB * GPU_MEMORY_UTILIZATION - memory_weight_bytes(m, precision)
    budget -= DEFAULT_OVERHEAD_PER_GPU * GB
    return max(1, math.floor(budget / kv_per_token(m)))


_Name = TypeVar("_Name", bound=str)


def _one_of(name: str, names: tuple[_Name, ...], what: str) -> _Name:
    """`name` (any case) as one of `names`; CapacityInputError names them otherwise."""
    found = next((n for n in names if n == name.lower()), None)
    if found is None:
        raise CapacityInputError(f"unknown {what} {name!r}; choose one of {', '.join(names)}")
    return found


def _preset(name: str) -> SimGpu:
    return _one_of(name, SIM_GPUS, "sim GPU preset")


def _model(name: str) -> SimModel:
    return _one_of(name, SIM_MODELS, "sim model")


def _precision(name: str) -> Precision:
    return _one_of(name, PRECISIONS, "precision")


def sim_calibration(
    name: str, model: str = DEFAULT_SIM_MODEL, precision: str = "bf16"
) -> SimCalibration:
    """The calibration of GPU preset `name` (one of `SIM_GPUS`) for `model` in `precision`;
    see the module docstring. fp8 on a card without FP8 (a100) raises CapacityInputError."""
    preset, sim_model, prec = _preset(name), _model(model), _precision(precision)
    gpu, m, eff = _gpu(preset), model_preset(sim_model), EFFICIENCY[preset]
    peak, bf16 = peak_flops(gpu, prec), peak_flops(gpu, "bf16")
    bandwidth = gpu.bandwidth_gbs * GB * eff.bw_efficiency
    layers = m.layer_params
    if layers is None:  # the folded model: every parameter per token, nothing else
        per_token, attn = 2 * m.params_b * 1e9 / (peak * eff.prefill_mfu), 0.0
    else:
        per_token = 2 * layers / (peak * eff.prefill_mfu)
        attn = 4 * m.layers * (m.heads or 0) * m.head_dim / (bf16 * eff.prefill_mfu)
    per_patch, pair = 0.0, 0.0
    v = m.vision
    if v is not None:
        matmuls: float = v.depth * v.block_params + v.embed_params
        matmuls += v.mergers * v.merger_params / v.spatial_merge**2
        per_patch = 2 * matmuls / (peak * eff.encoder_mfu)
        pair = 4 * v.depth * v.hidden / (bf16 * eff.encoder_mfu)
    return SimCalibration(
        preset=preset, gpu=gpu.name, model=sim_model, precision=prec,
        step_overhead=ANCHOR_STEP_OVERHEAD,
        # Rounded (to 1e-9 s, 1e-15 s for the pair terms): the anchor's figures come back exactly.
        tpot_base=round(decode_weight_bytes(m, prec) / bandwidth, 9),
        tpot_per_seq=round(kv_read_tokens_per_seq() * kv_per_token(m) / bandwidth, 9),
        prefill_cost_per_token=round(per_token, 9),
        prefill_attn_cost=round(attn, 15),
        encoder_cost_per_patch=round(per_patch, 12),
        encoder_attn_cost=round(pair, 15),
        kv_capacity_tokens=kv_capacity_tokens(gpu, m, prec),
        kv_bytes_per_token=int(kv_per_token(m)), kv_link_gbs=KV_LINK_GBS[preset],
    )  # fmt: skip


class DecodeFigures(Protocol):
    """The decode figures of `SimSettings` and of a `SimCalibration`."""

    @property
    def step_overhead(self) -> float: ...
    @property
    def tpot_base(self) -> float: ...
    @property
    def tpot_per_seq(self) -> float: ...


def sim_decode_seconds(f: DecodeFigures, batch: int) -> float:
    """One decode step (no prefill) of `batch` sequences, as the sim models it."""
    return f.step_overhead + f.tpot_base + f.tpot_per_seq * batch


class PrefillFigures(Protocol):
    """The prefill and encoder figures of `SimSettings` and of a `SimCalibration`."""

    @property
    def prefill_cost_per_token(self) -> float: ...
    @property
    def prefill_attn_cost(self) -> float: ...
    @property
    def encoder_cost_per_patch(self) -> float: ...
    @property
    def encoder_attn_cost(self) -> float: ...


def encoder_seconds(f: PrefillFigures, patches: int) -> float:
    """The vision encoder over one frame of `patches` patches."""
    return f.encoder_cost_per_patch * patches + f.encoder_attn_cost * patches * patches


def prefill_chunk_seconds(f: PrefillFigures, start: int, tokens: int) -> float:
    """The LLM prefill of `tokens` uncached tokens at prompt positions start..start+tokens-1."""
    positions = tokens * start + tokens * (tokens - 1) // 2  # each token attends to those before
    return f.prefill_cost_per_token * tokens + f.prefill_attn_cost * positions


def frame_tokens(model: str = DEFAULT_SIM_MODEL) -> tuple[int, int]:
    """(visual tokens, patches) of one FRAME_WIDTH x FRAME_HEIGHT frame for `model`."""
    v = model_preset(_model(model)).vision
    side = v.patch * v.spatial_merge if v is not None else 28  # the folded anchor: 28 px
    w, h = fit(FRAME_WIDTH, FRAME_HEIGHT, FRAME_WIDTH * FRAME_HEIGHT, side)
    tokens = (w // side) * (h // side)
    return tokens, tokens * (v.spatial_merge**2 if v is not None else 4)


def frame_seconds(cal: SimCalibration) -> float:
    """GPU time of one uncached frame: its encoder pass + the prefill of its tokens at the
    start of a prompt. 1 / this is the frames/s one GPU serves at 100 % busy (the same
    definition in `sy plan` and in the sim's tests)."""
    tokens, patches = frame_tokens(cal.model)
    return encoder_seconds(cal, patches) + prefill_chunk_seconds(cal, 0, tokens + _VISION_MARKERS)


def frames_per_second(cal: SimCalibration) -> float:
    return 1.0 / frame_seconds(cal)


def calibration_of(label: str | None) -> SimCalibration | None:
    """The preset behind a `SimSettings.calibration` label (`rtx5090`, `rtx5090+fp8`,
    `a100@qwen2.5-vl-7b`); None for a `+custom` label or one that names no preset."""
    if not label or label.endswith("+custom"):
        return None
    base, _, model = label.partition("@")
    gpu, _, precision = base.partition("+")
    try:
        return sim_calibration(gpu, model or DEFAULT_SIM_MODEL, precision or "bf16")
    except CapacityInputError:
        return None
