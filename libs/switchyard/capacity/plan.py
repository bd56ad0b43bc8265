"""A whole capacity plan: memory, speed, fleet size, redundancy, cost, agent latency.

GPUs needed = replica size × (max(N_mem, N_SLO, N_throughput) + spares) ([S2] §3):
- N_mem: replicas whose KV cache holds the target concurrency;
- N_SLO: replicas so each runs a batch small enough for the TPOT SLO;
- N_throughput: replicas for the target requests/s, each request costing its
  prefill time plus its share of the decode steps it takes part in.
Each replica carries its own weights, so N_mem is counted in replicas, which
is never less than [S2]'s pooled ceil((P b_w + B S m_kv + overhead) / (M u)).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from switchyard.capacity.cost import cost_per_million_tokens, cost_per_thousand_requests
from switchyard.capacity.errors import ModelDoesNotFit
from switchyard.capacity.interconnect import TP_DEGREES, ReplicaAdvice, advise
from switchyard.capacity.latency import StepLatency
from switchyard.capacity.memory import MemoryInput, MemoryPlan, plan_memory
from switchyard.capacity.performance import (
    DEFAULT_BW_EFFICIENCY,
    DEFAULT_MFU,
    Hardware,
    decode_step_seconds,
    max_batch_for_tpot,
    prefill_seconds,
)
from switchyard.capacity.presets import ModelSpec
from switchyard.capacity.units import GB, UNITS_NOTE, MemUnit

# Activations, CUDA graphs, cuBLAS/NCCL workspace per GPU when none is given: the
# single-GPU figure of [S2] §3.2 (4 GB on an L40S); [S2] §3.1 uses 20 GB for 4 × H100.
DEFAULT_OVERHEAD_PER_GPU = 4.0
# Network + image preprocessing + routing + JSON parse of an agent step when none is given.
DEFAULT_FIXED_MS = 30.0
# Longer than any context window a model ships with: a bigger figure is a typo.
MAX_CONTEXT = 2**24
# Bytes per weight or KV element: 4 is FP32, the widest format an engine serves.
MAX_ELEMENT_BYTES = 4


class PlanRequest(BaseModel):
    """Everything a plan depends on. Memory figures are read in `mem_unit`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelSpec
    gpu_name: str = "custom"
    gpu_mem: float = Field(gt=0)
    bandwidth_gbs: float | None = Field(None, gt=0)
    dense_tflops: float | None = Field(None, gt=0)
    nvlink: bool = False
    gpus: int | None = Field(None, ge=1, description="per replica; None = smallest that fits")
    util: float = Field(0.9, gt=0, le=1)
    overhead: float | None = Field(None, ge=0, description="per replica; None = 4 per GPU")
    weight_bytes: float = Field(2, gt=0, le=MAX_ELEMENT_BYTES)
    weights: float | None = Field(None, ge=0)
    kv_bytes: float = Field(2, gt=0, le=MAX_ELEMENT_BYTES)
    context: int = Field(ge=1, le=MAX_CONTEXT)
    block_tokens: int = Field(16, ge=1)
    mem_unit: MemUnit = MemUnit.GB
    bw_efficiency: float = Field(DEFAULT_BW_EFFICIENCY, gt=0, le=1)
    mfu: float = Field(DEFAULT_MFU, gt=0, le=1)
    concurrency: int | None = Field(None, ge=1, description="target concurrent sequences")
    target_rps: float | None = Field(None, gt=0)
    prompt_tokens: int | None = Field(None, ge=1)
    output_tokens: int | None = Field(None, ge=1)
    prefix_hit: float = Field(0.0, ge=0, lt=1, description="fraction of prompt tokens cached")
    slo_tpot_ms: float | None = Field(None, gt=0)
    slo_ttft_ms: float | None = Field(None, gt=0)
    redundancy: int = Field(0, ge=0, description="spare replicas (1 = N+1)")
    gpu_price_per_hour: float | None = Field(None, ge=0)
    utilisation: float = Field(1.0, gt=0, le=1, description="average load, for cost")
    step_slo_ms: float | None = Field(None, gt=0)
    fixed_ms: float = Field(DEFAULT_FIXED_MS, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> PlanRequest:
        if self.output_tokens is not None and self.output_tokens >= self.context:
            raise ValueError(f"output_tokens {self.output_tokens} must be < context {self.context}")
        prompt = self.prompt_tokens
        if prompt is not None and prompt + (self.output_tokens or 0) > self.context:
            raise ValueError("prompt_tokens + output_tokens exceed the context")
        if self.target_rps is not None and self.output_tokens is None:
            raise ValueError("target_rps needs output_tokens (tokens generated per request)")
        return self

    def hardware(self, gpus: int) -> Hardware | None:
        """The compute of a replica of `gpus` GPUs; None without bandwidth and FLOPs."""
        if self.bandwidth_gbs is None or self.dense_tflops is None:
            return None
        return Hardware(
            bandwidth_gbs=self.bandwidth_gbs, dense_tflops=self.dense_tflops, gpus=gpus,
            bw_efficiency=self.bw_efficiency, mfu=self.mfu,
        )  # fmt: skip

    @property
    def effective_prompt_tokens(self) -> int:
        if self.prompt_tokens is not None:
            return self.prompt_tokens
        return max(1, self.context - (self.output_tokens or 0))


class Performance(BaseModel):
    """Per replica, at its operating batch (the most the memory and TPOT SLO allow)."""

    model_config = ConfigDict(frozen=True)

    batch: int
    tpot_ms: float
    decode_tokens_per_s: float
    prefill_ms: float
    ttft_ms: float
    requests_per_s: float | None
    output_tokens_per_s: float


class Fleet(BaseModel):
    model_config = ConfigDict(frozen=True)

    replica_gpus: int
    replicas_by_memory: int | None
    replicas_by_slo: int | None
    replicas_by_throughput: int | None
    replicas: int | None
    spare_replicas: int
    total_gpus: int | None
    ttft_slo_met: bool | None
    problems: list[str]


class AgentBudget(BaseModel):
    model_config = ConfigDict(frozen=True)

    batch: int
    step: StepLatency
    step_slo_ms: float | None
    max_output_tokens: int | None
    output_tokens: int | None
    step_ms: float | None


class CapacityPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    request: PlanRequest
    memory: MemoryPlan
    interconnect: ReplicaAdvice
    performance: Performance | None
    fleet: Fleet
    cost_per_million_output_tokens: float | None
    cost_per_thousand_requests: float | None
    agent: AgentBudget | None

    def as_dict(self) -> dict[str, Any]:
        """Flat JSON: the memory answer at top level, the rest in sections."""
        req, mem = self.request, self.memory
        return {
            "units": UNITS_NOTE,
            "mem_unit": req.mem_unit.value,
            "model": req.model.name,
            "gpu": req.gpu_name,
            "gpus_per_replica": self.fleet.replica_gpus,
            "context": req.context,
            "kv_bytes_per_token": mem.kv_bytes_per_token,
            "kv_mib_per_token": mem.kv_bytes_per_token / 2**20,
            "weights_gb": mem.weights_bytes / GB,
            "overhead_gb": mem.overhead_bytes / GB,
            "usable_gb": mem.usable_bytes / GB,
            "kv_budget_gb": mem.kv_budget_gb,
            "kv_budget_gib": mem.kv_budget_gib,
            "kv_per_request_gb": mem.kv_per_request_gb,
            "kv_per_request_gib": mem.kv_per_request_gib,
            "max_concurrency": mem.max_concurrency,
            "interconnect": self.interconnect.model_dump(),
            "performance": self.performance.model_dump() if self.performance else None,
            "fleet": self.fleet.model_dump(),
            "cost_per_million_output_tokens": self.cost_per_million_output_tokens,
            "cost_per_thousand_requests": self.cost_per_thousand_requests,
            "agent": self.agent.model_dump() if self.agent else None,
            "assumptions": {
                "bw_efficiency": req.bw_efficiency,
                "mfu": req.mfu,
                "prefix_hit": req.prefix_hit,
                "fixed_ms": req.fixed_ms,
                "utilisation": req.utilisation,
                "block_tokens": req.block_tokens,
            },
        }


def _memory_input(req: PlanRequest, gpus: int) -> MemoryInput:
    overhead = req.overhead if req.overhead is not None else DEFAULT_OVERHEAD_PER_GPU * gpus
    m = req.model
    return MemoryInput(
        gpu_mem=req.gpu_mem, gpus=gpus, util=req.util, overhead=overhead,
        params_b=m.params_b, weight_bytes=req.weight_bytes, weights=req.weights,
        layers=m.layers, kv_heads=m.kv_heads, head_dim=m.head_dim, kv_bytes=req.kv_bytes,
        context=req.context, block_tokens=req.block_tokens, mem_unit=req.mem_unit,
    )  # fmt: skip


def _ceil_div(a: float, b: float) -> int:
    return math.ceil(a / b - 1e-9)


def _no_kv_budget(
    req: PlanRequest, mem: MemoryPlan, gpus: int, advice: ReplicaAdvice
) -> ModelDoesNotFit:
    taken = mem.weights_bytes + mem.overhead_bytes
    reason = (
        f"{req.model.name} does not fit {gpus} × {req.gpu_name}: weights "
        f"{mem.weights_bytes / GB:.2f} GB + overhead {mem.overhead_bytes / GB:.2f} GB exceed "
        f"the usable {mem.usable_bytes / GB:.2f} GB by {(taken - mem.usable_bytes) / GB:.2f} GB"
    )
    fewest = advice.tensor_parallel
    if fewest is not None and fewest > gpus:
        reason += f"; a replica of {fewest} GPUs holds it"
    elif fewest is None:
        reason += f"; not even {TP_DEGREES[-1]} GPUs hold it: quantise the weights"
    return ModelDoesNotFit(reason)


def plan(req: PlanRequest) -> CapacityPlan:
    """Compute a plan; infeasible parts are reported in `fleet.problems`, not raised.

    Raises `ModelDoesNotFit` when weights and overhead leave no KV budget at all.
    """
    per_gpu_overhead = DEFAULT_OVERHEAD_PER_GPU if req.overhead is None else None
    advice = advise(_memory_input(req, req.gpus or 1), req.nvlink, per_gpu_overhead)
    replica_gpus = req.gpus or advice.tensor_parallel or TP_DEGREES[-1]
    mem = plan_memory(_memory_input(req, replica_gpus))
    if mem.kv_budget_bytes <= 0:
        raise _no_kv_budget(req, mem, replica_gpus, advice)
    problems: list[str] = []
    if not mem.fits:
        problems.append(
            f"one {req.context}-token request does not fit: KV budget "
            f"{mem.kv_budget_bytes / GB:.2f} GB < {mem.kv_per_request_bytes / GB:.2f} GB"
        )

    perf: Performance | None = None
    agent: AgentBudget | None = None
    b_slo: int | None = None
    ttft_ok: bool | None = None
    hw = req.hardware(replica_gpus)
    if hw is not None:
        tokens, per_tok, w = mem.kv_tokens_per_request, mem.kv_bytes_per_token, mem.weights_bytes
        batch = mem.max_concurrency
        if req.slo_tpot_ms is not None:
            b_slo = max_batch_for_tpot(hw, w, per_tok, tokens, req.slo_tpot_ms / 1000)
            if b_slo == 0:
                problems.append(f"TPOT SLO {req.slo_tpot_ms} ms is unmet even at batch 1")
            batch = min(batch, b_slo)
        step_s = decode_step_seconds(hw, w, per_tok, max(batch, 1), tokens)
        uncached = req.effective_prompt_tokens * (1 - req.prefix_hit)
        prefill_s = prefill_seconds(hw, req.model.params_b, uncached)
        ttft_s = prefill_s + step_s
        rps: float | None = None
        out_tps = batch / step_s if batch >= 1 else 0.0
        if req.output_tokens is not None and batch >= 1:
            # GPU time one request costs: its prefill, plus its 1/batch share of each step.
            rps = 1 / (prefill_s + req.output_tokens * step_s / batch)
            out_tps = rps * req.output_tokens
        perf = Performance(
            batch=batch, tpot_ms=step_s * 1000, decode_tokens_per_s=batch / step_s,
            prefill_ms=prefill_s * 1000, ttft_ms=ttft_s * 1000, requests_per_s=rps,
            output_tokens_per_s=out_tps,
        )  # fmt: skip
        if req.slo_ttft_ms is not None:
            ttft_ok = ttft_s * 1000 <= req.slo_ttft_ms
            if not ttft_ok:
                problems.append(
                    f"TTFT {ttft_s * 1000:.0f} ms > SLO {req.slo_ttft_ms} ms before any queueing:"
                    " more replicas do not help; cache prefixes, shorten prompts or use more FLOPs"
                )

    by_mem = by_slo = by_tput = None
    if req.concurrency is not None and mem.max_concurrency >= 1:
        by_mem = _ceil_div(req.concurrency, mem.max_concurrency)
    if req.concurrency is not None and b_slo:
        by_slo = _ceil_div(req.concurrency, b_slo)
    if req.target_rps is not None and perf is not None and perf.requests_per_s:
        by_tput = _ceil_div(req.target_rps, perf.requests_per_s)
    if req.target_rps is not None and perf is None:
        problems.append("target_rps needs GPU bandwidth and FLOPs (a --gpu preset)")
    feasible = mem.fits and not (req.slo_tpot_ms is not None and b_slo == 0)
    replicas = max([1, *(n for n in (by_mem, by_slo, by_tput) if n is not None)])
    fleet = Fleet(
        replica_gpus=replica_gpus, replicas_by_memory=by_mem, replicas_by_slo=by_slo,
        replicas_by_throughput=by_tput, replicas=replicas if feasible else None,
        spare_replicas=req.redundancy,
        total_gpus=(replicas + req.redundancy) * replica_gpus if feasible else None,
        ttft_slo_met=ttft_ok, problems=problems,
    )  # fmt: skip

    cost = cost_1k = None
    price = req.gpu_price_per_hour
    if price is not None and perf is not None and perf.output_tokens_per_s > 0:
        cost = cost_per_million_tokens(
            price, replica_gpus, perf.output_tokens_per_s, req.utilisation
        )
        if perf.requests_per_s:
            cost_1k = cost_per_thousand_requests(
                price, replica_gpus, perf.requests_per_s, req.utilisation
            )

    if (
        hw is not None
        and perf is not None
        and (req.step_slo_ms is not None or req.output_tokens is not None)
    ):
        agent = _agent_budget(req, mem, perf, fleet, hw)
    return CapacityPlan(
        request=req, memory=mem, interconnect=advice, performance=perf, fleet=fleet,
        cost_per_million_output_tokens=cost, cost_per_thousand_requests=cost_1k, agent=agent,
    )  # fmt: skip


def _agent_budget(
    req: PlanRequest, mem: MemoryPlan, perf: Performance, fleet: Fleet, hw: Hardware
) -> AgentBudget:
    """Step latency at the batch each replica really runs (the target spread over replicas)."""
    batch = max(perf.batch, 1)
    if req.concurrency is not None and fleet.replicas:
        batch = max(1, min(batch, _ceil_div(req.concurrency, fleet.replicas)))
    tpot_s = decode_step_seconds(
        hw, mem.weights_bytes, mem.kv_bytes_per_token, batch, mem.kv_tokens_per_request
    )
    step = StepLatency(
        fixed_ms=req.fixed_ms, ttft_ms=perf.prefill_ms + tpot_s * 1000, tpot_ms=tpot_s * 1000
    )
    return AgentBudget(
        batch=batch, step=step, step_slo_ms=req.step_slo_ms,
        max_output_tokens=step.max_output_tokens(req.step_slo_ms) if req.step_slo_ms else None,
        output_tokens=req.output_tokens,
        step_ms=step.step_ms(req.output_tokens) if req.output_tokens else None,
    )  # fmt: skip
