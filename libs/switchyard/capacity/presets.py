"""Model and GPU presets, each number with the document it comes from.

Model shapes are read from each model's Hugging Face `config.json` (for Qwen3-VL
the `text_config`, since the KV cache only lives in the language model).
Parameter counts are totals including embeddings and, for the VLM, the vision
encoder: those bytes occupy memory and are read on every decode step.

GPU memory is the label on the card in GB. The physical capacity is usually the
same number in GiB (an "80 GB" H100 reports 81,559 MiB), so using the label as
10^9 bytes under-counts by about 7 %: a deliberately conservative reading.

FLOPs are dense (no 2:4 sparsity) BF16/FP16 tensor throughput with FP32
accumulation, the mode vLLM's BF16 kernels use. GeForce cards run FP32
accumulation at half the FP16-accumulation rate; the marketing figure (and
[S2] §6's 330 TFLOPS for the RTX 4090) is the FP16-accumulation one.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from switchyard.capacity.errors import CapacityInputError
from switchyard.capacity.units import MAX_PARAMS


class VisionSpec(BaseModel):
    """A VLM's vision encoder (a ViT with full attention over a frame's patches, then
    patch mergers into the language model's width): what its cost per frame needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    depth: int = Field(ge=1)
    hidden: int = Field(ge=1)
    intermediate: int = Field(ge=1)
    heads: int = Field(ge=1)
    patch: int = Field(ge=1, description="px per patch side")
    temporal_patch: int = Field(ge=1, description="frames per patch (an image is repeated)")
    spatial_merge: int = Field(ge=1, description="patches merged per token side")
    out_hidden: int = Field(ge=1, description="the language model's width")
    mergers: int = Field(1, ge=1, description="patch mergers: the final one + DeepStack's")

    @property
    def block_params(self) -> int:
        """Matmul weights of one ViT block: qkv, output projection, a two-matrix MLP."""
        return 4 * self.hidden * self.hidden + 2 * self.hidden * self.intermediate

    @property
    def merger_params(self) -> int:
        """One merger's MLP: merge^2 patches' features -> same width -> out_hidden."""
        width = self.hidden * self.spatial_merge**2
        return width * width + width * self.out_hidden

    @property
    def embed_params(self) -> int:
        """The patch embedding (a convolution over 3 x temporal x patch x patch pixels)."""
        return 3 * self.temporal_patch * self.patch * self.patch * self.hidden

    @property
    def params(self) -> int:
        return (
            self.depth * self.block_params + self.mergers * self.merger_params + (self.embed_params)
        )


class ModelSpec(BaseModel):
    """What capacity planning needs to know about a transformer.

    `hidden`, `heads`, `intermediate` and `vocab` (the language model's shapes) and
    `vision` are optional: with them the planner and the sim count matmul FLOPs, attention
    and the vision encoder from the shapes; without them a token costs 2 x `params_b`
    FLOPs and every parameter is read per decode step (the folded model)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    params_b: float = Field(gt=0, le=MAX_PARAMS / 1e9, description="total parameters, billions")
    layers: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    hidden: int | None = Field(None, ge=1)
    heads: int | None = Field(None, ge=1)
    intermediate: int | None = Field(None, ge=1, description="MLP width (gated: 3 matrices)")
    vocab: int | None = Field(None, ge=1)
    vision: VisionSpec | None = None
    source: str = ""

    @property
    def layer_params(self) -> int | None:
        """Matmul weights of the language model's layers (attention + gated MLP), or None
        without the shapes."""
        if self.hidden is None or self.heads is None or self.intermediate is None:
            return None
        attn = 2 * self.hidden * self.heads * self.head_dim
        attn += 2 * self.hidden * self.kv_heads * self.head_dim
        return self.layers * (attn + 3 * self.hidden * self.intermediate)


class GpuSpec(BaseModel):
    """One accelerator: capacity, bandwidth, dense compute and its GPU-to-GPU link."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    memory_gb: float = Field(gt=0, description="label capacity, 10^9 bytes")
    bandwidth_gbs: float = Field(gt=0, description="memory bandwidth, 10^9 B/s")
    dense_tflops: float = Field(gt=0, description="dense BF16/FP16 tensor, FP32 accumulate")
    fp8_tflops: float | None = Field(None, gt=0, description="dense FP8 tensor; None = no FP8")
    nvlink_gbs: float | None = Field(None, description="NVLink bandwidth; None = PCIe only")
    source: str = ""

    @property
    def has_nvlink(self) -> bool:
        return self.nvlink_gbs is not None


MODELS: dict[str, ModelSpec] = {
    # https://huggingface.co/Qwen/Qwen2.5-7B-Instruct config.json: num_hidden_layers 28,
    # num_attention_heads 28, num_key_value_heads 4, hidden_size 3584 (head_dim 3584/28 = 128);
    # model card: "Number of Parameters: 7.61B".
    "qwen2.5-7b": ModelSpec(
        name="Qwen2.5-7B-Instruct", params_b=7.61, layers=28, kv_heads=4, head_dim=128,
        source="huggingface.co/Qwen/Qwen2.5-7B-Instruct config.json + model card",
    ),
    # https://huggingface.co/Qwen/Qwen2.5-VL-7B-Instruct config.json: num_hidden_layers 28,
    # num_attention_heads 28, num_key_value_heads 4, hidden_size 3584 (head_dim 128): the
    # language model is Qwen2.5-7B's; 8.29B parameters with the 675M vision encoder (BF16
    # safetensors ~16.6 GB). The model the `sim` engine is calibrated for (`calibration`).
    "qwen2.5-vl-7b": ModelSpec(
        name="Qwen2.5-VL-7B-Instruct", params_b=8.29, layers=28, kv_heads=4, head_dim=128,
        source="huggingface.co/Qwen/Qwen2.5-VL-7B-Instruct config.json + model card",
    ),
    # https://huggingface.co/Qwen/Qwen3-VL-8B-Instruct config.json (as quoted in public test
    # fixtures, e.g. TensorRT-LLM's Qwen3-VL scenario): text_config num_hidden_layers 36,
    # hidden_size 4096, num_attention_heads 32, num_key_value_heads 8, head_dim 128,
    # intermediate_size 12288, vocab_size 151936, tie_word_embeddings false; vision_config
    # depth 27, hidden_size 1152, intermediate_size 4304, num_heads 16, patch_size 16,
    # temporal_patch_size 2, spatial_merge_size 2, out_hidden_size 4096,
    # deepstack_visual_indexes [8, 16, 24] (three DeepStack mergers beside the final one;
    # transformers' configuration_qwen3_vl.py has the same vision defaults). From these
    # shapes: 6.95B in the 36 layers + 2 x 0.62B embedding/LM head + 0.57B vision = 8.76B,
    # the model card's 8.77B (BF16 safetensors ~17.5 GB). The sim's default model.
    "qwen3-vl-8b": ModelSpec(
        name="Qwen3-VL-8B-Instruct", params_b=8.77, layers=36, kv_heads=8, head_dim=128,
        hidden=4096, heads=32, intermediate=12288, vocab=151936,
        vision=VisionSpec(
            depth=27, hidden=1152, intermediate=4304, heads=16, patch=16, temporal_patch=2,
            spatial_merge=2, out_hidden=4096, mergers=4,
        ),
        source="huggingface.co/Qwen/Qwen3-VL-8B-Instruct config.json (text + vision config)",
    ),
    # https://huggingface.co/meta-llama/Meta-Llama-3-8B config.json: num_hidden_layers 32,
    # num_attention_heads 32, num_key_value_heads 8, hidden_size 4096; 8.03B parameters.
    "llama-3-8b": ModelSpec(
        name="Meta-Llama-3-8B", params_b=8.03, layers=32, kv_heads=8, head_dim=128,
        source="huggingface.co/meta-llama/Meta-Llama-3-8B config.json",
    ),
    # https://huggingface.co/meta-llama/Meta-Llama-3-70B config.json: num_hidden_layers 80,
    # num_attention_heads 64, num_key_value_heads 8, hidden_size 8192; 70.6B parameters.
    # The same shape as the "70B" of [S2] §3.1 (which rounds to 70B).
    "llama-3-70b": ModelSpec(
        name="Meta-Llama-3-70B", params_b=70.6, layers=80, kv_heads=8, head_dim=128,
        source="huggingface.co/meta-llama/Meta-Llama-3-70B config.json",
    ),
}  # fmt: skip

GPUS: dict[str, GpuSpec] = {
    # GeForce RTX 5090 (Blackwell GB202): 32 GB GDDR7, 512-bit, 1,792 GB/s; FP16 tensor 419
    # TFLOPS dense with FP16 accumulate (838 sparse), 209.5 with FP32 accumulate; PCIe 5.0,
    # no NVLink. NVIDIA RTX Blackwell GPU architecture whitepaper / GeForce RTX 5090 specs.
    # FP8 tensor 419 TFLOPS dense with FP32 accumulate (838 with FP16 accumulate): the
    # whitepaper's figures as main-horse.github.io/posts/5090-mm-perf lists them beside its
    # measured mma peaks (f8 FP32-accumulate 370 = 0.88 of 419; bf16 FP32-accumulate 370.6,
    # 1.77 x its 209.5 spec: the BF16 spec understates what the tensor cores run).
    "rtx-5090": GpuSpec(
        name="GeForce RTX 5090 32GB", memory_gb=32, bandwidth_gbs=1792, dense_tflops=209.5,
        fp8_tflops=419, nvlink_gbs=None,
        source="NVIDIA RTX Blackwell whitepaper (FP32-accumulate dense)",
    ),
    # GeForce RTX 4090 (Ada AD102): 24 GB GDDR6X, 1,008 GB/s; FP16 tensor 330.3 dense with FP16
    # accumulate, 165.2 with FP32 accumulate; PCIe 4.0, no NVLink. NVIDIA Ada Lovelace
    # architecture whitepaper, appendix table. [S2] §6 lists 330 (FP16-accumulate).
    "rtx-4090": GpuSpec(
        name="GeForce RTX 4090 24GB", memory_gb=24, bandwidth_gbs=1008, dense_tflops=165.2,
        nvlink_gbs=None, source="NVIDIA Ada Lovelace whitepaper (FP32-accumulate dense)",
    ),
    # L40S: 48 GB GDDR6, 864 GB/s, BF16/FP16 tensor 362.05 dense (733 sparse), PCIe Gen4 x16,
    # no NVLink. NVIDIA L40S datasheet; [S2] §6 agrees (362 TFLOPS, PCIe).
    "l40s": GpuSpec(
        name="L40S 48GB", memory_gb=48, bandwidth_gbs=864, dense_tflops=362.05,
        nvlink_gbs=None, source="NVIDIA L40S datasheet",
    ),
    # A100 80GB SXM: HBM2e 2,039 GB/s, BF16 tensor 312 dense, NVLink 600 GB/s. NVIDIA A100
    # datasheet; [S2] §6 rounds to 2.0 TB/s.
    "a100-80gb": GpuSpec(
        name="A100 80GB SXM", memory_gb=80, bandwidth_gbs=2039, dense_tflops=312,
        nvlink_gbs=600, source="NVIDIA A100 datasheet (SXM)",
    ),
    # H100 80GB SXM: HBM3 3.35 TB/s, BF16 tensor 989 dense (1,979 sparse), FP8 tensor 1,979
    # dense (3,958 sparse), NVLink 900 GB/s. NVIDIA H100 datasheet; [S2] §3.1 and §6 use the
    # same figures.
    "h100-80gb": GpuSpec(
        name="H100 80GB SXM", memory_gb=80, bandwidth_gbs=3350, dense_tflops=989,
        fp8_tflops=1979, nvlink_gbs=900, source="NVIDIA H100 datasheet (SXM)",
    ),
    # H200 SXM: 141 GB HBM3e, 4.8 TB/s, BF16 tensor 989 dense, NVLink 900 GB/s.
    # NVIDIA H200 datasheet; [S2] §6 agrees.
    "h200": GpuSpec(
        name="H200 141GB SXM", memory_gb=141, bandwidth_gbs=4800, dense_tflops=989,
        nvlink_gbs=900, source="NVIDIA H200 datasheet (SXM)",
    ),
}  # fmt: skip


def model_preset(name: str) -> ModelSpec:
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise CapacityInputError(
            f"unknown model preset {name!r}; choose one of {', '.join(MODELS)}"
        ) from None


def gpu_preset(name: str) -> GpuSpec:
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise CapacityInputError(
            f"unknown GPU preset {name!r}; choose one of {', '.join(GPUS)}"
        ) from None
