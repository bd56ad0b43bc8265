"""Build the configured engine. Backends import lazily: the vLLM image has no
llama.cpp and the CPU image has no vLLM."""

from __future__ import annotations

from switchyard.engines.base import Engine, EngineError, EngineKind
from switchyard.engines.pool import EnginePool

ENGINE_KINDS: tuple[EngineKind, ...] = ("vllm", "llamacpp", "sim")


def make_engine(kind: str, *, instances: int = 1) -> Engine:
    """An engine of `kind` with settings from the environment (`SY_LLAMACPP_*`, `SY_SIM_*`,
    `SY_VLLM_*`; `SY_SIM_GPU` picks the sim's calibration preset). `instances` > 1 runs
    that many one-sequence engines side by side."""
    if kind == "llamacpp":
        from switchyard.engines.llamacpp import LlamaCppEngine, LlamaCppSettings

        settings = LlamaCppSettings()
        return EnginePool([LlamaCppEngine(settings) for _ in range(max(1, instances))])
    if kind == "sim":
        from switchyard.engines.sim import SimEngine, SimSettings

        return SimEngine(SimSettings())
    if kind == "vllm":
        from switchyard.engines.vllm import VllmEngine, VllmSettings

        return VllmEngine(VllmSettings())
    raise EngineError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")
