"""`VllmSettings.precision` reaches real vLLM: fp8 (W8A8) is vLLM's `quantization="fp8"`."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchyard.engines.base import EngineError
from switchyard.engines.vllm import VllmEngine, engine_args_kwargs

from .conftest import engine_settings
from .test_engine import chat, run

pytestmark = pytest.mark.vllm


async def test_fp8_precision_reaches_the_engine_arguments(vllm_model: Path) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    settings = engine_settings(vllm_model, precision="fp8")
    kw = engine_args_kwargs(settings)
    assert kw["quantization"] == "fp8"
    # vLLM's own argument class takes it as given (bf16 passes none: the checkpoint's dtype).
    assert AsyncEngineArgs(**kw).quantization == "fp8"
    assert "quantization" not in engine_args_kwargs(engine_settings(vllm_model))
    # On this CPU build fp8 either runs or is refused at start as a typed engine error
    # naming the model, never as a raw exception.
    engine = VllmEngine(settings)
    try:
        await engine.start()
    except EngineError as e:
        assert e.code == "engine_error" and str(vllm_model) in str(e)
        return
    try:
        deltas = await run(engine, chat("fp8", max_tokens=4))
        assert deltas[-1].finish_reason in ("length", "stop")
    finally:
        await engine.close()
