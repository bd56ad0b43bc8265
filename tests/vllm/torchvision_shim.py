"""torchvision for the vision tests, without its C ops.

vLLM's Qwen-VL modules (and transformers' Qwen-VL processor, through its video
processor) import torchvision, which `.venv-vllm` lacks: PyPI's torchvision is built
against CUDA torch, so its C ops (`_C.so`: nms, roi_align, ...) do not load beside the
local 2.13.0+cpu torch, and its import then fails registering fake kernels for
`torchvision::nms`/`qnms`. The Qwen-VL path needs none of those ops, only the pure-torch
transforms. So PyPI's torchvision 0.28.0 (torch 2.13's) is installed with --no-deps
beside the virtualenv, not in it (`DIR`, by deploy/local/ensure-vllm.sh), and the two op
schemas are defined before it is imported, in this process and in the processes it
starts (`install`: a `sitecustomize` on their PYTHONPATH).
Test set-up only: a GPU image has vLLM's own torchvision.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

DIR = Path(sys.prefix) / "torchvision-noops"
SITE = Path(sys.prefix) / "torchvision-noops-site"  # its `sitecustomize`, for children
OPS = """\
import torch

_torchvision_lib = torch.library.Library("torchvision", "DEF")
for _schema in ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
                "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"):
    _torchvision_lib.define(_schema)
"""
_NAMESPACE: dict[str, Any] = {}  # the ops live as long as their `Library` object


def install() -> str | None:
    """Make `DIR` importable in this process and in every process it starts; None, or
    why it is not.

    Runs when the tier's conftest is imported: transformers decides once, when it is
    first imported, whether torchvision is there. Children see it through PYTHONPATH,
    with a `sitecustomize` there that defines the ops before anything imports
    torchvision: vLLM's spawned engine core and model inspection (multiprocessing's
    spawn hands them this process's `sys.path`, so they would find torchvision without
    its ops otherwise) and worker processes alike.
    """
    if importlib.util.find_spec("torchvision") is not None:
        return None
    if not (DIR / "torchvision").is_dir():
        return f"no torchvision at {DIR}"
    if "transformers" in sys.modules:
        return "transformers was imported before torchvision could be put beside it"
    exec(compile(OPS, "<torchvision ops>", "exec"), _NAMESPACE)
    SITE.mkdir(parents=True, exist_ok=True)
    if not (SITE / "sitecustomize.py").exists() or (SITE / "sitecustomize.py").read_text() != OPS:
        (SITE / "sitecustomize.py").write_text(OPS)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE), str(DIR), *([before] if before else [])])
    sys.path.insert(0, str(DIR))
    return None
