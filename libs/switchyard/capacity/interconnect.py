"""Data parallel or tensor parallel: what the GPU-to-GPU link allows ([S4] §6.5, §7.2).

Tensor parallelism all-reduces activations twice per layer per step. Over NVLink
(600-900 GB/s) that is cheap; over PCIe (~32-64 GB/s, through the CPU's root
complex on consumer boards) it costs every token. So:

- a model that fits one GPU runs one full engine per GPU (data parallel), whatever
  the link — replicas scale throughput and survive a GPU loss independently;
- TP only when the model does not fit one GPU, and then within an NVLink domain;
- without NVLink, first try smaller weights (FP8, then 4-bit) so it fits one GPU.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from switchyard.capacity.memory import MemoryInput, plan_memory

TP_DEGREES = (1, 2, 4, 8)
# Weight precisions worth suggesting on a PCIe-only box, most accurate first.
_QUANTISED_WEIGHT_BYTES = ((1.0, "FP8/INT8"), (0.5, "4-bit (AWQ/GPTQ)"))


class ReplicaAdvice(BaseModel):
    model_config = ConfigDict(frozen=True)

    tensor_parallel: int | None  # None: does not fit even on 8 GPUs
    nvlink: bool
    advice: str


def _at(inp: MemoryInput, gpus: int, overhead_per_gpu: float | None, **update: float) -> bool:
    changes: dict[str, float | int] = {"gpus": gpus, **update}
    if overhead_per_gpu is not None:
        changes["overhead"] = overhead_per_gpu * gpus
    return plan_memory(inp.model_copy(update=changes)).fits


def smallest_replica(
    inp: MemoryInput, overhead_per_gpu: float | None = None, **update: float
) -> int | None:
    """Fewest GPUs (1, 2, 4, 8) on which weights + overhead + one full request fit."""
    for k in TP_DEGREES:
        if _at(inp, k, overhead_per_gpu, **update):
            return k
    return None


def advise(inp: MemoryInput, nvlink: bool, overhead_per_gpu: float | None = None) -> ReplicaAdvice:
    k = smallest_replica(inp, overhead_per_gpu)
    if k == 1:
        text = "fits one GPU: run one engine per GPU (data parallel), no tensor parallel"
    elif k is None:
        text = "does not fit 8 GPUs even with tensor parallel: quantise, shorten the context"
        text += " or use pipeline parallel across nodes"
    elif nvlink:
        text = f"needs {k} GPUs: tensor parallel TP={k} inside one NVLink domain,"
        text += " data parallel across such replicas"
    else:
        text = f"does not fit one GPU; TP={k} over PCIe pays an all-reduce per layer per token"
        for weight_bytes, label in _QUANTISED_WEIGHT_BYTES:
            if (
                inp.weights is None
                and smallest_replica(inp, overhead_per_gpu, weight_bytes=weight_bytes) == 1
            ):
                text += f"; {label} weights fit one GPU: prefer that, one engine per GPU"
                break
        else:
            text += "; accept TP over PCIe or use a GPU with NVLink"
    return ReplicaAdvice(tensor_parallel=k, nvlink=nvlink, advice=text)
