"""The sim engine's calibrations: the A100 measured point (folded Qwen2.5-VL-7B), and every
card's own figures for Qwen3-VL-8B's shapes, in bf16 and fp8."""

from __future__ import annotations

import pytest

from switchyard.capacity import GPUS, CapacityInputError, sim_calibration
from switchyard.capacity.calibration import (
    ANCHOR_PREFILL_PER_TOKEN,
    ANCHOR_STEP_OVERHEAD,
    ANCHOR_TPOT_BASE,
    ANCHOR_TPOT_PER_SEQ,
    EFFICIENCY,
    GPU_OF,
    SIM_GPUS,
    anchor_bw_efficiency,
    anchor_mfu,
    calibration_of,
    frame_seconds,
    frame_tokens,
    frames_per_second,
)
from switchyard.capacity.presets import model_preset
from switchyard.engines.base import EngineRequest
from switchyard.engines.sim import SimEngine, SimSettings
from switchyard.messages.inference import Image, Sampling


def test_the_a100_anchor_is_the_measured_point() -> None:
    a100 = sim_calibration("a100", "qwen2.5-vl-7b")
    assert a100.gpu == GPUS["a100-80gb"].name
    figures = (a100.step_overhead, a100.tpot_base, a100.tpot_per_seq, a100.prefill_cost_per_token)
    assert figures == (
        ANCHOR_STEP_OVERHEAD, ANCHOR_TPOT_BASE, ANCHOR_TPOT_PER_SEQ, ANCHOR_PREFILL_PER_TOKEN
    )  # fmt: skip
    # The folded model: no encoder or attention term; the efficiencies are plausible ones.
    assert (a100.prefill_attn_cost, a100.encoder_cost_per_patch) == (0.0, 0.0)
    assert 0.5 < anchor_bw_efficiency() < 0.9
    assert 0.3 < anchor_mfu() < 0.6
    # 0.9 x 80 GB - 8.29B bf16 weights - 4 GB, at 28,672 fp8 KV bytes a token.
    assert a100.kv_capacity_tokens == int((80e9 * 0.9 - 8.29e9 * 2 - 4e9) / 28_672)


def test_qwen3_vl_shapes_give_its_parameters_and_kv() -> None:
    m = model_preset("qwen3-vl-8b")
    assert m.vision is not None and m.layer_params is not None and m.vocab and m.hidden
    total = m.layer_params + 2 * m.vocab * m.hidden + m.vision.params
    assert total / 1e9 == pytest.approx(m.params_b, rel=0.005)  # the model card's 8.77B
    assert 0.55e9 < m.vision.params < 0.6e9
    assert frame_tokens("qwen3-vl-8b") == (880, 3520)  # 1280x704 in 32 px tokens
    # 36 layers x 8 KV heads x 128 x K,V x 1 byte (fp8) = 73,728 bytes a token.
    rtx = sim_calibration("rtx5090")
    kv = 36 * 8 * 128 * 2
    weights = 8.77e9 * 2
    assert rtx.kv_capacity_tokens == int((32e9 * 0.9 - weights - 4e9) / kv)


@pytest.mark.parametrize("name", SIM_GPUS)
def test_each_card_uses_its_own_peak_bandwidth_and_efficiency(name: str) -> None:
    cal, gpu, eff = sim_calibration(name), GPUS[GPU_OF[name]], EFFICIENCY[name]
    m = model_preset("qwen3-vl-8b")
    assert m.layer_params is not None and m.vocab and m.hidden
    decode_bytes = m.layer_params * 2 + m.vocab * m.hidden * 2
    assert cal.tpot_base == pytest.approx(
        decode_bytes / (gpu.bandwidth_gbs * 1e9 * eff.bw_efficiency), rel=1e-4
    )
    assert cal.prefill_cost_per_token == pytest.approx(
        2 * m.layer_params / (gpu.dense_tflops * 1e12 * eff.prefill_mfu), rel=1e-4
    )
    assert cal.step_overhead == ANCHOR_STEP_OVERHEAD  # CPU work, not the GPU's


def test_fp8_only_where_the_card_has_it() -> None:
    with pytest.raises(CapacityInputError, match="no FP8 tensor math"):
        sim_calibration("a100", precision="fp8")
    for name in ("h100", "rtx5090"):
        bf16, fp8 = sim_calibration(name), sim_calibration(name, precision="fp8")
        assert frame_seconds(fp8) < 0.7 * frame_seconds(bf16)  # FP8 matmuls at twice the rate
        assert fp8.tpot_base < 0.6 * bf16.tpot_base
    with pytest.raises(CapacityInputError, match="bf16, fp8"):
        sim_calibration("h100", precision="int4")


def test_labels_name_their_preset_and_unknown_names() -> None:
    assert calibration_of("rtx5090+fp8") == sim_calibration("rtx5090", precision="fp8")
    assert calibration_of("a100@qwen2.5-vl-7b") == sim_calibration("a100", "qwen2.5-vl-7b")
    assert calibration_of("h100+custom") is None and calibration_of(None) is None
    assert sim_calibration("RTX5090") == sim_calibration("rtx5090")
    with pytest.raises(CapacityInputError, match="a100, h100, rtx5090"):
        sim_calibration("rtx-5090")  # the planner's name, not the sim's


@pytest.mark.parametrize(
    ("gpu", "precision"), [("a100", "bf16"), ("h100", "fp8"), ("rtx5090", "bf16"),
                           ("rtx5090", "fp8")],
)  # fmt: skip
async def test_the_planner_and_the_sim_agree_on_frames_per_second(gpu: str, precision: str) -> None:
    """frames/s at 100 % busy: the planner's `frames_per_second` against the sim engine's
    own prefill of one uncached 1280x720 frame (as the preprocessor resizes it)."""
    from switchyard.cli.plan_commands import plan_frames

    settings = SimSettings(gpu=gpu, precision=precision, delay_scale=0.0)  # type: ignore[arg-type]
    engine = SimEngine(settings)
    await engine.start()
    try:
        request = EngineRequest(
            request_id="frame", prompt="",
            images=(Image(hash="f" * 32, data=b"\x89PNG", mime="image/png", width=1280,
                          height=704),),
            sampling=Sampling(max_tokens=1, temperature=0.0),
        )  # fmt: skip
        async for _ in engine.generate(request):
            pass
        t = engine.timings("frame")
    finally:
        await engine.close()
    assert t is not None and t.ttft is not None
    sim_fps = 1.0 / (t.ttft - engine.tpot(1))
    planner = plan_frames("qwen3-vl-8b", GPU_OF[gpu], precision)  # type: ignore[index]
    assert planner is not None
    assert planner == pytest.approx(frames_per_second(sim_calibration(gpu, precision=precision)))
    assert sim_fps == pytest.approx(planner, rel=0.10)
