"""The sim engine's GPU calibrations: the A100 measured point, the others derived from
the planner's GPU presets by the ratio that bounds each term."""

from __future__ import annotations

import pytest

from switchyard.capacity import GPUS, CapacityInputError, sim_calibration
from switchyard.capacity.calibration import (
    ANCHOR_PREFILL_PER_TOKEN,
    ANCHOR_STEP_OVERHEAD,
    ANCHOR_TPOT_BASE,
    ANCHOR_TPOT_PER_SEQ,
    GPU_OF,
    SIM_GPUS,
    bw_efficiency,
    mfu,
)


def test_the_a100_preset_is_the_measured_point() -> None:
    a100 = sim_calibration("a100")
    assert a100.gpu == GPUS["a100-80gb"].name
    figures = (a100.step_overhead, a100.tpot_base, a100.tpot_per_seq, a100.prefill_cost_per_token)
    assert figures == (
        ANCHOR_STEP_OVERHEAD, ANCHOR_TPOT_BASE, ANCHOR_TPOT_PER_SEQ, ANCHOR_PREFILL_PER_TOKEN
    )  # fmt: skip
    # The efficiencies that measured point implies are the ones a real engine reaches.
    assert 0.5 < bw_efficiency() < 0.9
    assert 0.3 < mfu() < 0.6


@pytest.mark.parametrize("name", ["h100", "rtx5090"])
def test_other_gpus_scale_by_bandwidth_flops_and_memory(name: str) -> None:
    a100, cal = sim_calibration("a100"), sim_calibration(name)
    ref, gpu = GPUS[GPU_OF["a100"]], GPUS[GPU_OF[name]]  # type: ignore[index]
    bw = ref.bandwidth_gbs / gpu.bandwidth_gbs
    assert cal.tpot_base == pytest.approx(a100.tpot_base * bw, rel=1e-6)
    assert cal.tpot_per_seq == pytest.approx(a100.tpot_per_seq * bw, rel=1e-4)
    assert cal.prefill_cost_per_token == pytest.approx(
        a100.prefill_cost_per_token * ref.dense_tflops / gpu.dense_tflops, rel=1e-4
    )
    assert cal.step_overhead == a100.step_overhead  # CPU work, not the GPU's


def test_kv_capacity_is_what_memory_leaves_beside_the_weights() -> None:
    # 0.9 of the card - 8.29B bf16 weights - 4 GB overhead, at 28,672 fp8 KV bytes a token.
    for name in SIM_GPUS:
        mem = GPUS[GPU_OF[name]].memory_gb * 1e9
        expected = (mem * 0.9 - 8.29e9 * 2 - 4e9) / (28 * 4 * 128 * 2 * 1)
        assert sim_calibration(name).kv_capacity_tokens == int(expected)
    small, large = sim_calibration("rtx5090"), sim_calibration("a100")
    assert small.kv_capacity_tokens < large.kv_capacity_tokens


def test_order_of_the_gpus_and_unknown_names() -> None:
    by = {n: sim_calibration(n) for n in SIM_GPUS}
    assert by["h100"].tpot_base < by["a100"].tpot_base < by["rtx5090"].tpot_base
    # The 5090's FP32-accumulate BF16 rate is below the A100's: slower prefill.
    assert by["h100"].prefill_cost_per_token < by["a100"].prefill_cost_per_token
    assert by["a100"].prefill_cost_per_token < by["rtx5090"].prefill_cost_per_token
    assert sim_calibration("RTX5090") == by["rtx5090"]
    with pytest.raises(CapacityInputError, match="a100, h100, rtx5090"):
        sim_calibration("rtx-5090")  # the planner's name, not the sim's
