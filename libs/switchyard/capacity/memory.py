"""The memory budget of one engine replica: weights, KV cache, overhead ([S2] §3).

    usable           = M_gpu × gpus × u
    weights          = P × b_w                      (or a figure given directly)
    KV bytes / token = 2 × layers × kv_heads × head_dim × b_kv   (K and V)
    KV budget        = usable − weights − overhead
    KV / request     = context × KV bytes / token
    max concurrency  = floor(KV budget / KV per request)

A replica is one engine: `gpus` > 1 means tensor parallel, where weights and KV
are split across the GPUs, so the pooled formula holds to first order.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from switchyard.capacity.units import GB, MAX_PARAMS, GiB, MemUnit

# Floating error in e.g. 43.2 − 14 − 4 must not turn an exact 6.0 into 5.
_FLOOR_EPSILON = 1e-9


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, kv_bytes: float = 2) -> float:
    """Bytes of K and V cache one token takes across all layers."""
    return 2 * layers * kv_heads * head_dim * kv_bytes


def max_concurrency(kv_budget_bytes: float, kv_per_request_bytes: float) -> int:
    """How many full-context requests fit in the budget (0 if none, never negative)."""
    if kv_budget_bytes <= 0 or kv_per_request_bytes <= 0:
        return 0
    return math.floor(kv_budget_bytes / kv_per_request_bytes + _FLOOR_EPSILON)


class MemoryInput(BaseModel):
    """One replica's memory question. Memory figures are read in `mem_unit`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_mem: float = Field(gt=0, description="memory per GPU, in mem_unit")
    gpus: int = Field(1, ge=1, description="GPUs in one replica (tensor parallel degree)")
    util: float = Field(0.9, gt=0, le=1, description="fraction of memory the engine may use")
    overhead: float = Field(ge=0, description="activations + workspace per replica, mem_unit")
    params_b: float = Field(gt=0, le=MAX_PARAMS / 1e9, description="parameters, billions")
    weight_bytes: float = Field(2, gt=0, description="bytes per parameter (FP16 2, FP8 1)")
    weights: float | None = Field(None, ge=0, description="weights in mem_unit, overrides P×b_w")
    layers: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    kv_bytes: float = Field(2, gt=0, description="bytes per KV element (FP16 2, FP8 1)")
    context: int = Field(ge=1, description="tokens per sequence (prompt + output)")
    block_tokens: int = Field(1, ge=1, description="KV block size; a request rounds up to it")
    mem_unit: MemUnit = MemUnit.GB


class MemoryPlan(BaseModel):
    """The answer, in bytes; `*_gb` / `*_gib` properties convert."""

    model_config = ConfigDict(frozen=True)

    usable_bytes: float
    weights_bytes: float
    overhead_bytes: float
    kv_bytes_per_token: float
    kv_budget_bytes: float
    kv_tokens_per_request: int
    kv_per_request_bytes: float
    max_concurrency: int

    @property
    def fits(self) -> bool:
        """At least one full-context request fits beside the weights."""
        return self.max_concurrency >= 1

    @property
    def kv_budget_gb(self) -> float:
        return self.kv_budget_bytes / GB

    @property
    def kv_budget_gib(self) -> float:
        return self.kv_budget_bytes / GiB

    @property
    def kv_per_request_gb(self) -> float:
        return self.kv_per_request_bytes / GB

    @property
    def kv_per_request_gib(self) -> float:
        return self.kv_per_request_bytes / GiB

    def kv_for(self, requests: int) -> float:
        """Bytes of KV cache `requests` full-context requests hold."""
        return requests * self.kv_per_request_bytes


def weights_bytes(inp: MemoryInput) -> float:
    if inp.weights is not None:
        return inp.weights * inp.mem_unit.bytes
    return inp.params_b * 1e9 * inp.weight_bytes


def plan_memory(inp: MemoryInput) -> MemoryPlan:
    unit = inp.mem_unit.bytes
    usable = inp.gpu_mem * unit * inp.gpus * inp.util
    weights = weights_bytes(inp)
    overhead = inp.overhead * unit
    per_token = kv_bytes_per_token(inp.layers, inp.kv_heads, inp.head_dim, inp.kv_bytes)
    tokens = math.ceil(inp.context / inp.block_tokens) * inp.block_tokens
    budget = usable - weights - overhead
    per_request = tokens * per_token
    return MemoryPlan(
        usable_bytes=usable,
        weights_bytes=weights,
        overhead_bytes=overhead,
        kv_bytes_per_token=per_token,
        kv_budget_bytes=budget,
        kv_tokens_per_request=tokens,
        kv_per_request_bytes=per_request,
        max_concurrency=max_concurrency(budget, per_request),
    )
