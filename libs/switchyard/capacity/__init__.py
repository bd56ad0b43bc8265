"""Capacity planning from first principles: memory, speed, fleet size, cost, latency budget.

Importable by other code and tests; `sy plan` is a thin CLI over `plan()`.
Units: see `units` (GB = 10^9 bytes, GiB = 2^30 bytes).
"""

from switchyard.capacity.calibration import SIM_GPUS, SimCalibration, SimGpu, sim_calibration
from switchyard.capacity.cost import cost_per_million_tokens, cost_per_thousand_requests
from switchyard.capacity.errors import CapacityInputError, ModelDoesNotFit
from switchyard.capacity.interconnect import ReplicaAdvice, advise, smallest_replica
from switchyard.capacity.latency import StepLatency
from switchyard.capacity.memory import (
    MemoryInput,
    MemoryPlan,
    kv_bytes_per_token,
    max_concurrency,
    plan_memory,
)
from switchyard.capacity.performance import (
    Hardware,
    decode_step_seconds,
    decode_tokens_per_second,
    max_batch_for_tpot,
    prefill_seconds,
)
from switchyard.capacity.plan import CapacityPlan, PlanRequest, plan
from switchyard.capacity.presets import GPUS, MODELS, GpuSpec, ModelSpec, gpu_preset, model_preset
from switchyard.capacity.units import GB, UNITS_NOTE, GiB, MemUnit, MiB, parse_params

__all__ = [
    "GB", "GPUS", "MODELS", "SIM_GPUS", "UNITS_NOTE", "CapacityInputError", "CapacityPlan",
    "GiB", "GpuSpec", "Hardware", "MemUnit", "MemoryInput", "MemoryPlan", "MiB",
    "ModelDoesNotFit", "ModelSpec", "PlanRequest", "ReplicaAdvice", "SimCalibration", "SimGpu",
    "StepLatency", "advise", "cost_per_million_tokens", "cost_per_thousand_requests",
    "decode_step_seconds", "decode_tokens_per_second", "gpu_preset", "kv_bytes_per_token",
    "max_batch_for_tpot", "max_concurrency", "model_preset", "parse_params", "plan",
    "plan_memory", "prefill_seconds", "sim_calibration", "smallest_replica",
]  # fmt: skip
