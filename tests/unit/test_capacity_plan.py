"""`switchyard.capacity` and `sy plan` against the worked examples of the seed documents.

Where a seed's number disagrees with its own formula the test follows the formula
and records the seed's figure next to it (see deploy/capacity.md).
"""

from __future__ import annotations

import json
import math
import re

import pytest
import typer
from pydantic import ValidationError
from typer.testing import CliRunner

from switchyard.capacity import (
    GPUS,
    MODELS,
    CapacityInputError,
    GiB,
    Hardware,
    MemoryInput,
    MemUnit,
    MiB,
    ModelDoesNotFit,
    PlanRequest,
    StepLatency,
    advise,
    cost_per_million_tokens,
    cost_per_thousand_requests,
    decode_step_seconds,
    gpu_preset,
    kv_bytes_per_token,
    max_batch_for_tpot,
    model_preset,
    parse_params,
    plan,
    plan_memory,
    prefill_seconds,
)
from switchyard.cli import plan_commands

pytestmark = pytest.mark.unit

# `sy` with only `plan` registered (as cli/app.py does), so these tests do not depend on
# every other command module importing cleanly.
app = typer.Typer()
app.callback()(lambda: None)
plan_commands.register(app)


def memory(**kw: object) -> MemoryInput:
    base: dict[str, object] = {"util": 0.9, "weight_bytes": 2, "kv_bytes": 2, "block_tokens": 1}
    return MemoryInput.model_validate({**base, **kw})


# --- [S2] §3.1: 70B FP16 on 4 × H100 80 GB --------------------------------------------------


S2_70B = {"layers": 80, "kv_heads": 8, "head_dim": 128, "params_b": 70}


def s2_70b(context: int = 8192) -> MemoryInput:
    return memory(gpu_mem=80, gpus=4, overhead=20, context=context, **S2_70B)


def test_s2_70b_kv_bytes_per_token() -> None:
    assert kv_bytes_per_token(80, 8, 128, 2) == 327_680
    assert kv_bytes_per_token(80, 8, 128, 2) / MiB == 0.3125


def test_s2_70b_budget_per_request_and_concurrency() -> None:
    m = plan_memory(s2_70b())
    assert m.usable_bytes == pytest.approx(288e9)
    assert m.weights_bytes == pytest.approx(140e9)
    assert m.kv_budget_gb == pytest.approx(128.0)
    assert round(m.kv_per_request_gb, 2) == 2.68  # "约 2.7 GB"
    assert m.kv_per_request_gib == pytest.approx(2.5)  # 8192 × 0.3125 MiB = 2560 MiB
    assert m.max_concurrency == 47  # 128 / 2.684 = 47.7
    # 30 concurrent hold ~80 GB (75 GiB); 100 need ~268 GB (250 GiB), more than the budget.
    assert m.kv_for(30) / 1e9 == pytest.approx(80.5, abs=0.1)
    assert m.kv_for(30) / GiB == pytest.approx(75.0)
    assert m.kv_for(100) / GiB == pytest.approx(250.0)
    assert m.kv_for(100) > m.kv_budget_bytes


def test_s2_70b_matches_the_sources_own_code() -> None:
    """[S2] §3.3's plan_capacity(80, 4, 0.9, 70, 2, 80, 8, 128, 8192), transcribed."""
    total = 80 * 4 * 0.9
    weights = 70 * 1e9 * 2 / 1e9
    per_req = 2 * 80 * 8 * 128 * 2 * 8192 / 1e9
    budget = total - weights - 20
    source = {"kv_budget_gb": round(budget, 1), "kv_per_request_gb": round(per_req, 2),
              "max_concurrency": max(0, int(budget // per_req))}  # fmt: skip
    m = plan_memory(s2_70b())
    ours = {"kv_budget_gb": round(m.kv_budget_gb, 1), "kv_per_request_gb":
            round(m.kv_per_request_gb, 2), "max_concurrency": m.max_concurrency}  # fmt: skip
    assert ours == source == {"kv_budget_gb": 128.0, "kv_per_request_gb": 2.68,
                              "max_concurrency": 47}  # fmt: skip


def test_s2_70b_decode_prefill_and_throughput() -> None:
    peak = Hardware(bandwidth_gbs=3350, dense_tflops=989, gpus=4, bw_efficiency=1.0, mfu=0.4)
    w, kv = 140e9, kv_bytes_per_token(80, 8, 128)
    # Weights 140 GB + KV of 30 × 8K (~80 GB) over 4 × 3.35 TB/s: "理论单步约 16.4 ms".
    assert decode_step_seconds(peak, w, kv, 30, 8192) * 1000 == pytest.approx(16.4, abs=0.1)
    real = peak.model_copy(update={"bw_efficiency": 0.6})
    step = decode_step_seconds(real, w, kv, 30, 8192)
    assert step * 1000 == pytest.approx(27.4, abs=0.1)  # "约 27 ms", under the 50 ms TPOT SLO
    assert 30 / step == pytest.approx(1100, rel=0.01)  # "约 1100 token/s"
    # 2 × 70e9 × 8192 FLOPs at 40 % of 4 × 989 TFLOPS: "prefill 约 0.73 秒".
    assert prefill_seconds(peak, 70, 8192) == pytest.approx(0.725, abs=0.005)


def test_s2_70b_cost_per_million_tokens() -> None:
    # 4 × H100 at $3/h, 1100 tokens/s: "约 3.0 美元/百万 token"; "30% 利用率时约 10 美元".
    assert cost_per_million_tokens(3, 4, 1100) == pytest.approx(3.03, abs=0.01)
    assert cost_per_million_tokens(3, 4, 1100, 0.3) == pytest.approx(10.1, abs=0.05)
    with pytest.raises(CapacityInputError):
        cost_per_million_tokens(3, 4, 0)
    # [S4] §9.1 unit_economics(2.5, 1, 12 rps): "cost_per_1k_requests" rounds to 0.058.
    assert round(cost_per_thousand_requests(2.5, 1, 12), 3) == 0.058


def test_s2_70b_fleet_with_n_plus_one_needs_eight_gpus() -> None:
    req = PlanRequest(
        model=model_preset("llama-3-70b").model_copy(update={"params_b": 70}),
        gpu_name="h100", gpu_mem=80, bandwidth_gbs=3350, dense_tflops=989, nvlink=True,
        gpus=4, overhead=20, context=8192, concurrency=30, output_tokens=500,
        slo_tpot_ms=50, redundancy=1,
    )  # fmt: skip
    p = plan(req)
    assert p.memory.max_concurrency == 47
    assert p.fleet.replicas_by_memory == 1
    assert p.fleet.replicas_by_slo == 1
    assert p.fleet.total_gpus == 8  # "要做 N+1 高可用，至少准备 8 张卡"
    assert p.fleet.problems == []


# --- [S2] §3.2: 7B MHA on an L40S 48 GB, two readings of one table ---------------------------

MHA_7B = {"layers": 32, "kv_heads": 32, "head_dim": 128, "params_b": 7}
S2_TABLE = {4096: (2, 12), 8192: (4, 6), 32768: (16, 1)}  # context: (GiB per request, conc.)


def test_s2_7b_kv_per_token_is_half_a_mib() -> None:
    assert kv_bytes_per_token(32, 32, 128) == MiB // 2


@pytest.mark.parametrize("context", list(S2_TABLE))
def test_s2_7b_per_request_gib(context: int) -> None:
    m = plan_memory(memory(gpu_mem=48, overhead=4, context=context, **MHA_7B))
    assert m.kv_per_request_gib == S2_TABLE[context][0]


@pytest.mark.parametrize(("context", "expected"), [(4096, 11), (8192, 5), (32768, 1)])
def test_s2_7b_decimal_reading_our_convention(context: int, expected: int) -> None:
    """48 GB × 0.9 − 14 GB − 4 GB = 25.2 × 10^9 bytes against requests of 2/4/16 GiB."""
    m = plan_memory(memory(gpu_mem=48, overhead=4, context=context, **MHA_7B))
    assert m.kv_budget_gb == pytest.approx(25.2)
    assert m.max_concurrency == expected


@pytest.mark.parametrize("context", list(S2_TABLE))
def test_s2_7b_gib_reading_reproduces_the_sources_table(context: int) -> None:
    """The table divides "25.2" by GiB per request, i.e. it reads every GB figure as GiB."""
    m = plan_memory(
        memory(gpu_mem=48, overhead=4, weights=14, context=context, mem_unit=MemUnit.GiB,
               **MHA_7B)
    )  # fmt: skip
    assert m.kv_budget_gib == pytest.approx(25.2)
    assert m.max_concurrency == S2_TABLE[context][1]


def test_s2_7b_gqa_variant() -> None:
    gqa = {**MHA_7B, "kv_heads": 8}
    assert kv_bytes_per_token(32, 8, 128) / MiB == 0.125
    m = plan_memory(memory(gpu_mem=48, overhead=4, context=32768, **gqa))
    assert m.kv_per_request_gib == 4
    # "并发可提升约 4 倍": the floors give 5 vs 1 (decimal) or 6 vs 1 (GiB reading).
    assert m.max_concurrency == 5


# --- [S4] §2.5: 8B GQA on an 80 GB card; the source's numbers are half its formula's --------

S4_8B = {"layers": 32, "kv_heads": 8, "head_dim": 128, "params_b": 8}
# What [S4] §2.5 (and its table and exercise 2) claims for 32K: "≈ 2 GB/序列 → 约 7 并发";
# its code comment for 8K claims "约 29" concurrent.
S4_CLAIM_GB_PER_SEQ_32K, S4_CLAIM_CONC_32K, S4_CLAIM_CONC_8K = 2.0, 7, 29


def s4_8b(context: int, unit: MemUnit = MemUnit.GiB) -> MemoryInput:
    # "free = 80 − 6 − 16": the source subtracts before util, so util = 1 here.
    return memory(gpu_mem=80, util=1.0, overhead=6, weights=16, context=context,
                  mem_unit=unit, **S4_8B)  # fmt: skip


def test_s4_formula_per_sequence_and_concurrency() -> None:
    m32, m8 = plan_memory(s4_8b(32768)), plan_memory(s4_8b(8192))
    assert m32.kv_per_request_gib == 4.0
    assert m8.kv_per_request_gib == 1.0
    assert m32.kv_budget_gib == 58.0
    assert (m32.max_concurrency, m8.max_concurrency) == (14, 58)
    # Decimal reading of the same inputs, for comparison.
    d32, d8 = plan_memory(s4_8b(32768, MemUnit.GB)), plan_memory(s4_8b(8192, MemUnit.GB))
    assert (d32.max_concurrency, d8.max_concurrency) == (13, 54)


def test_s4_discrepancy_is_a_factor_of_two() -> None:
    """Recorded, not reproduced: the source's figures are half of what its formula gives."""
    m32, m8 = plan_memory(s4_8b(32768)), plan_memory(s4_8b(8192))
    assert m32.kv_per_request_gib == 2 * S4_CLAIM_GB_PER_SEQ_32K
    assert m32.max_concurrency == 2 * S4_CLAIM_CONC_32K
    assert m8.max_concurrency == 2 * S4_CLAIM_CONC_8K


def test_s4_section_9_70b_and_cost_discrepancies() -> None:
    # §9.3 says a 70B GQA-8 8K sequence takes "约 0.20 GB"; its own expression gives 2.5 GiB.
    assert 80 * 8192 * 8 * 128 * 2 * 2 / GiB == 2.5
    # §9.4's cost_per_million_tokens(2.5, 1, 30, 0.6) treats GPU-seconds as hours (returns
    # 138,889; the comment says "约 139"); $2.5/h at 18 effective tokens/s is $38.58 per 1M.
    assert cost_per_million_tokens(2.5, 1, 30, 0.6) == pytest.approx(38.58, abs=0.01)
    source_function = 1 * (1e6 / max(1, 30 * 0.6)) * 2.5
    assert source_function == pytest.approx(138_888.9, abs=0.1)


# --- presets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "per_token"),
    [("qwen2.5-7b", 57_344), ("qwen2.5-vl-7b", 57_344), ("qwen3-vl-8b", 147_456),
     ("llama-3-8b", 131_072), ("llama-3-70b", 327_680)],
)  # fmt: skip
def test_model_presets_kv_per_token(name: str, per_token: int) -> None:
    m = model_preset(name)
    assert kv_bytes_per_token(m.layers, m.kv_heads, m.head_dim) == per_token


def test_presets_sanity() -> None:
    assert set(MODELS) == {
        "qwen2.5-7b", "qwen2.5-vl-7b", "qwen3-vl-8b", "llama-3-8b", "llama-3-70b"
    }  # fmt: skip
    assert set(GPUS) == {"rtx-5090", "rtx-4090", "l40s", "a100-80gb", "h100-80gb", "h200"}
    assert {k for k, g in GPUS.items() if not g.has_nvlink} == {"rtx-5090", "rtx-4090", "l40s"}
    for g in GPUS.values():
        assert g.source
        # Decode is bandwidth-bound: every card does >50 FLOPs per byte it can read.
        assert g.dense_tflops * 1e12 / (g.bandwidth_gbs * 1e9) > 50
    assert gpu_preset("RTX-5090").bandwidth_gbs == 1792
    assert gpu_preset("h200").memory_gb == 141
    for m in MODELS.values():
        assert m.source and 5 < m.params_b < 80
    with pytest.raises(CapacityInputError, match="choose one of"):
        model_preset("gpt-5")
    with pytest.raises(CapacityInputError, match="choose one of"):
        gpu_preset("tpu")


# --- interconnect ----------------------------------------------------------------------------


def preset_memory(model: str, gpu: str, context: int = 8192) -> MemoryInput:
    m, g = model_preset(model), gpu_preset(gpu)
    return memory(gpu_mem=g.memory_gb, overhead=4, context=context, params_b=m.params_b,
                  layers=m.layers, kv_heads=m.kv_heads, head_dim=m.head_dim)  # fmt: skip


def test_small_model_is_data_parallel_even_with_nvlink() -> None:
    for gpu in ("rtx-5090", "h100-80gb"):
        a = advise(preset_memory("qwen2.5-7b", gpu), gpu_preset(gpu).has_nvlink)
        assert a.tensor_parallel == 1
        assert "one engine per GPU" in a.advice


def test_70b_uses_tp_over_nvlink_and_warns_over_pcie() -> None:
    h100 = advise(preset_memory("llama-3-70b", "h100-80gb"), True, overhead_per_gpu=4)
    assert h100.tensor_parallel == 4 and "NVLink" in h100.advice
    rtx = advise(preset_memory("llama-3-70b", "rtx-5090"), False, overhead_per_gpu=4)
    assert rtx.tensor_parallel == 8 and "PCIe" in rtx.advice
    assert "accept TP over PCIe" in rtx.advice  # even 4-bit 70B (35 GB) misses one 5090


def test_pcie_advice_suggests_fp8_when_that_fits_one_gpu() -> None:
    a = advise(preset_memory("qwen3-vl-8b", "rtx-4090"), False, overhead_per_gpu=4)
    assert a.tensor_parallel == 2
    assert "FP8/INT8 weights fit one GPU" in a.advice


# --- throughput, SLO, agent latency ----------------------------------------------------------


def test_max_batch_for_tpot_is_the_largest_within_the_slo() -> None:
    hw = Hardware(bandwidth_gbs=1792, dense_tflops=209.5)
    w, kv = 15.2e9, 57_344
    b = max_batch_for_tpot(hw, w, kv, 4096, 0.030)
    assert (
        decode_step_seconds(hw, w, kv, b, 4096)
        <= 0.030
        < decode_step_seconds(hw, w, kv, b + 1, 4096)
    )
    assert max_batch_for_tpot(hw, w, kv, 4096, 0.001) == 0


def test_step_latency_budget() -> None:
    s = StepLatency(fixed_ms=30, ttft_ms=200, tpot_ms=10)
    assert s.step_ms(1) == 230
    assert s.step_ms(16) == 380
    o = s.max_output_tokens(500)
    assert o == 28 and s.step_ms(o) <= 500 < s.step_ms(o + 1)
    assert s.max_output_tokens(229) == 0
    with pytest.raises(ValueError, match="at least one token"):
        s.step_ms(0)


def test_plan_sizes_by_throughput_and_reports_infeasible_slos() -> None:
    g = gpu_preset("rtx-5090")
    base = {
        "model": model_preset("qwen2.5-7b"), "gpu_name": g.name, "gpu_mem": g.memory_gb,
        "bandwidth_gbs": g.bandwidth_gbs, "dense_tflops": g.dense_tflops, "context": 4096,
        "output_tokens": 200, "prompt_tokens": 1000,
    }  # fmt: skip
    p = plan(PlanRequest.model_validate({**base, "target_rps": 20, "redundancy": 1}))
    assert p.performance is not None and p.performance.requests_per_s is not None
    n = math.ceil(20 / p.performance.requests_per_s)
    assert p.fleet.replicas_by_throughput == n and p.fleet.total_gpus == n + 1
    # A TPOT SLO below the weights' read time is unmeetable; the plan says so.
    tight = plan(PlanRequest.model_validate({**base, "slo_tpot_ms": 5, "concurrency": 10}))
    assert tight.fleet.total_gpus is None
    assert any("TPOT SLO" in p for p in tight.fleet.problems)
    slow = plan(PlanRequest.model_validate({**base, "slo_ttft_ms": 10}))
    assert slow.fleet.ttft_slo_met is False


def test_plan_request_rejects_inconsistent_input() -> None:
    with pytest.raises(ValidationError, match="target_rps needs output_tokens"):
        PlanRequest(model=model_preset("llama-3-8b"), gpu_mem=80, context=4096, target_rps=3)
    with pytest.raises(ValidationError, match="must be < context"):
        PlanRequest(model=model_preset("llama-3-8b"), gpu_mem=80, context=16, output_tokens=16)
    with pytest.raises(ValidationError):
        PlanRequest(model=model_preset("llama-3-8b"), gpu_mem=80, context=4096, util=1.5)


# --- the CLI ---------------------------------------------------------------------------------


def run(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    out: dict[str, object] = json.loads(result.stdout)
    return out


def test_cli_explicit_flags_reproduce_s2_70b() -> None:
    out = run(
        "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--params", "70",
        "--weight-bytes", "2", "--kv-bytes", "2", "--gpu-mem-gb", "80", "--gpus", "4",
        "--util", "0.9", "--overhead-gb", "20", "--context", "8192",
    )  # fmt: skip
    assert out["kv_bytes_per_token"] == 327_680
    assert out["kv_budget_gb"] == pytest.approx(128.0)
    assert out["kv_per_request_gb"] == pytest.approx(2.684, abs=0.001)
    assert out["max_concurrency"] == 47
    assert "GB = 10^9 bytes" in str(out["units"]) and "GiB = 2^30" in str(out["units"])
    assert out["performance"] is None  # no bandwidth or FLOPs given


def test_cli_gib_reading_and_presets() -> None:
    out = run(
        "--layers", "32", "--kv-heads", "32", "--head-dim", "128", "--params", "7",
        "--weights-gb", "14", "--gpu-mem-gb", "48", "--overhead-gb", "4", "--context", "4096",
        "--mem-unit", "GiB",
    )  # fmt: skip
    assert out["max_concurrency"] == 12
    agent = run("--model", "qwen3-vl-8b", "--gpu", "rtx-5090", "--context", "4096",
                "--step-slo-ms", "500", "--output-tokens", "16")  # fmt: skip
    assert agent["gpus_per_replica"] == 1
    # A 4,080-token uncached prompt: prefill alone (~854 ms) is over the 500 ms step SLO.
    budget = agent["agent"]
    assert isinstance(budget, dict)
    step = budget["step"]
    assert step["fixed_ms"] + step["ttft_ms"] > 500
    assert budget["max_output_tokens"] == 0
    assert budget["step_ms"] == pytest.approx(
        step["fixed_ms"] + step["ttft_ms"] + 15 * step["tpot_ms"]
    )
    # A 1,200-token prompt, 20 % cached, 30 phones: the largest output that meets the SLO.
    short = run("--model", "qwen3-vl-8b", "--gpu", "rtx-5090", "--context", "2048",
                "--prompt-tokens", "1200", "--prefix-hit", "0.2", "--concurrency", "30",
                "--step-slo-ms", "500", "--output-tokens", "16")["agent"]  # fmt: skip
    assert isinstance(short, dict)
    o, s = short["max_output_tokens"], short["step"]

    def step_ms(n: int) -> float:
        return float(s["fixed_ms"] + s["ttft_ms"] + s["tpot_ms"] * (n - 1))

    # 16 at the sim's RTX 5090 efficiencies (MFU 0.483, eta_bw 0.680; 13 at the generic 0.4 / 0.6).
    assert o == 16
    assert step_ms(o) <= 500 < step_ms(o + 1)


def test_cli_table_states_units_and_lists_presets() -> None:
    result = CliRunner().invoke(app, ["plan", "--model", "qwen2.5-7b", "--gpu", "rtx-5090"])
    assert result.exit_code == 0, result.output
    assert "GB = 10^9 bytes" in result.stdout and "max concurrency" in result.stdout
    listed = CliRunner().invoke(app, ["plan", "--list-presets", "--json"])
    assert set(json.loads(listed.stdout)["gpus"]) == set(GPUS)


QWEN_5090 = ["--model", "qwen2.5-7b", "--gpu", "rtx-5090"]


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--gpu", "rtx-5090"], "without --model"), (["--model", "qwen2.5-7b"], "--gpu-mem-gb"),
     (["--model", "nope", "--gpu", "l40s"], "unknown model preset"),
     (["--model", "qwen2.5-7b", "--gpu", "l40s", "--util", "2"], "util"),
     ([*QWEN_5090, "--params", "-7"], "--params: a parameter count must be a positive number"),
     ([*QWEN_5090, "--params", "0"], "--params: a parameter count must be a positive number"),
     ([*QWEN_5090, "--params", "seven"], "--params: 'seven' is not a parameter count"),
     ([*QWEN_5090, "--params", "50000"], "--params: '50000' is ambiguous"),
     ([*QWEN_5090, "--params", "20T"], "--params: '20T' is 2e+13 parameters"),
     ([*QWEN_5090, "--layers", "0"], "--layers: Input should be greater than or equal to 1"),
     ([*QWEN_5090, "--context", "0"], "--context: Input should be greater than or equal to 1"),
     ([*QWEN_5090, "--context", "99999999"], "--context: Input should be less than or equal"),
     ([*QWEN_5090, "--weight-bytes", "8"], "--weight-bytes: Input should be less than or equal"),
     ([*QWEN_5090, "--gpu-mem-gb", "-3"], "--gpu-mem-gb: Input should be greater than 0"),
     ([*QWEN_5090, "--output-tokens", "9000"], "error: output_tokens 9000 must be < context"),
     (["--model", "llama-3-70b", "--gpu", "h100-80gb", "--gpus", "1"],
      "does not fit 1 × H100 80GB SXM")],
)  # fmt: skip
def test_cli_bad_input_is_a_clear_error(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["plan", *args])
    assert result.exit_code == 2
    assert message in result.output
    assert isinstance(result.exception, SystemExit)  # an exit status, no traceback
    assert result.stdout == ""  # nothing that looks like a plan


# --- reading inputs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "billions"),
    [("70e9", 70), ("70B", 70), ("70b", 70), ("70", 70), ("70_000_000_000", 70), (" 70B ", 70),
     ("7.6b", 7.6), ("7.6", 7.6), ("7.6e9", 7.6), ("135M", 0.135), ("135e6", 0.135),
     ("1.5T", 1500), ("1e6", 0.001)],
)  # fmt: skip
def test_params_read_as_a_count_or_billions(text: str, billions: float) -> None:
    assert parse_params(text) == pytest.approx(billions)


@pytest.mark.parametrize(
    ("text", "message"),
    [("0", "positive"), ("-70B", "positive"), ("nan", "positive"), ("inf", "positive"),
     ("", "not a parameter count"), ("B", "not a parameter count"), ("7x", "not a parameter"),
     ("10000", "ambiguous"), ("999999", "ambiguous"), ("0.0001", "1e+05 parameters"),
     ("20T", "2e+13 parameters")],
)  # fmt: skip
def test_params_refuses_what_is_no_model(text: str, message: str) -> None:
    with pytest.raises(CapacityInputError, match=re.escape(message)):
        parse_params(text)


def test_cli_params_as_a_raw_count_means_the_same_as_billions() -> None:
    """`--params 70e9` used to be read as 70e9 billions: 140 billion GB of weights."""
    shape = ["--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--gpu-mem-gb", "80",
             "--gpus", "4", "--overhead-gb", "20", "--context", "8192"]  # fmt: skip
    outs = [run(*shape, "--params", p) for p in ("70", "70e9", "70B", "70000000000")]
    assert all(out == outs[0] for out in outs)
    assert outs[0]["weights_gb"] == pytest.approx(140.0)
    assert outs[0]["kv_budget_gb"] == pytest.approx(128.0)
    # The issue's own example, on a preset: the override is read the same way.
    preset = run("--model", "llama-3-70b", "--gpu", "h100-80gb", "--params", "70e9")
    assert preset["weights_gb"] == pytest.approx(140.0) and preset["gpus_per_replica"] == 4
    assert isinstance(preset["kv_budget_gb"], float) and preset["kv_budget_gb"] > 0


def test_a_model_that_leaves_no_kv_budget_is_refused_with_the_shortfall() -> None:
    g = gpu_preset("h100-80gb")
    one_gpu = PlanRequest(
        model=model_preset("llama-3-70b").model_copy(update={"params_b": 70}),
        gpu_name=g.name, gpu_mem=g.memory_gb, gpus=1, context=8192,
    )  # fmt: skip
    # 80 GB × 0.9 = 72 GB usable; 140 GB of weights + 4 GB overhead miss it by 72 GB.
    with pytest.raises(ModelDoesNotFit, match=r"exceed the usable 72\.00 GB by 72\.00 GB") as e:
        plan(one_gpu)
    assert "a replica of 4 GPUs holds it" in e.value.reason
    assert isinstance(e.value, CapacityInputError)  # what `sy plan` prints and exits 2 on
    huge = one_gpu.model_copy(update={"gpus": None, "model": one_gpu.model.model_copy(
        update={"params_b": 1000})})  # fmt: skip
    with pytest.raises(ModelDoesNotFit, match="not even 8 GPUs hold it"):
        plan(huge)
    # Weights that fit but leave less than one request's KV are a reported problem, as before.
    tight = plan(one_gpu.model_copy(update={"gpus": 4, "context": 2**20}))
    assert tight.fleet.total_gpus is None
    assert any("does not fit" in problem for problem in tight.fleet.problems)
