"""deploy/gpu/calibrate.py, the GPU calibration check, run as a process at toy size on the CPU.

On a GPU machine it times Qwen3-VL-8B's GEMMs and one random-weight forward pass; here,
with the same code on `--smoke` shapes, it must run end to end and account for the frame
as the model does: 4 x 6 patches of 16 px, merged 2x2, are 6 visual tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "deploy" / "gpu" / "calibrate.py"


def test_the_smoke_run_times_every_gemm_and_the_forward_pass(tmp_path: Path) -> None:
    out = tmp_path / "calibrate.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--device", "cpu", "--repeat", "1",
         "--json", str(out)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["smoke"] is True
    gemms = report["gemms"]
    # Four projections (qkv, o, gate_up, down) at the prefill rows and two decode batches.
    assert {(g["stage"], g["gemm"]) for g in gemms} == {
        (stage, gemm)
        for stage in ("prefill", "decode-b16", "decode-b64")
        for gemm in ("qkv", "o", "gate_up", "down")
    }
    assert all(g["bf16_s"] > 0 and "fp8_s" not in g for g in gemms)  # no FP8 on a CPU
    forward = report["forward"]
    assert (forward["patches"], forward["visual_tokens"], forward["prompt_tokens"]) == (24, 6, 14)
    assert forward["encoder_s"] > 0 and forward["prefill_s"] > 0 and forward["decode_step_s"] > 0
    assert "forward (" in done.stdout and "sim preset h100" in done.stdout
