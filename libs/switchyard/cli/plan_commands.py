"""`sy plan`: capacity planning from first principles (see deploy/capacity.md).

An input that cannot describe a deployment (a negative figure, an unreadable
parameter count, a model whose weights leave no room for a KV cache) is refused
with one `error: ...` line per problem on stderr and exit status 2, as typer's
own usage errors are: never a traceback, never a plan built on it.
"""

from __future__ import annotations

import json
from typing import Any

import typer
from pydantic import ValidationError
from rich.table import Table

from switchyard.capacity import (
    GPUS,
    MODELS,
    UNITS_NOTE,
    CapacityInputError,
    CapacityPlan,
    MemUnit,
    ModelSpec,
    PlanRequest,
    gpu_preset,
    model_preset,
    parse_params,
    plan,
)
from switchyard.capacity.calibration import (
    EFFICIENCY,
    GPU_OF,
    PRECISIONS,
    SIM_MODELS,
    SimGpu,
    frames_per_second,
    peak_flops,
    sim_calibration,
)
from switchyard.capacity.performance import DEFAULT_BW_EFFICIENCY, DEFAULT_MFU
from switchyard.capacity.plan import DEFAULT_FIXED_MS
from switchyard.capacity.roles import (
    ANSWER_TOKENS,
    DEFAULT_STEP_SLO_MS,
    RolePlan,
    best_split,
    split_ceilings,
)
from switchyard.cli import console, err
from switchyard.fleet.spec import role_split

# The flag behind each input field, where its name is not the flag's (`--<field>`).
_FLAGS = {
    "params_b": "--params", "gpu_mem": "--gpu-mem-gb", "overhead": "--overhead-gb",
    "weights": "--weights-gb", "dense_tflops": "--tflops",
}  # fmt: skip


def _flag(loc: tuple[int | str, ...]) -> str:
    field = str(loc[-1])
    return _FLAGS.get(field, f"--{field.replace('_', '-')}")


def _params(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_params(text)
    except CapacityInputError as exc:
        raise CapacityInputError(f"--params: {exc.reason}") from None


def _model(
    preset: str | None, params: str | None, layers: int | None, kv_heads: int | None,
    head_dim: int | None,
) -> ModelSpec:  # fmt: skip
    explicit = {
        "params_b": _params(params), "layers": layers, "kv_heads": kv_heads, "head_dim": head_dim,
    }  # fmt: skip
    given = {k: v for k, v in explicit.items() if v is not None}
    if preset is not None:
        # Validated, not `model_copy(update=...)`: an override must meet the same bounds.
        return ModelSpec.model_validate({**model_preset(preset).model_dump(), **given})
    missing = [f"--{k.removesuffix('_b').replace('_', '-')}" for k in explicit if k not in given]
    if missing:
        raise CapacityInputError(f"without --model, give {' '.join(missing)}")
    return ModelSpec.model_validate({"name": "custom", **given})


def _gpu(
    preset: str | None, mem: float | None, bandwidth: float | None, tflops: float | None,
    nvlink: bool | None,
) -> dict[str, Any]:  # fmt: skip
    if preset is not None:
        spec = gpu_preset(preset)
        return {
            "gpu_name": spec.name,
            "gpu_mem": spec.memory_gb if mem is None else mem,
            "bandwidth_gbs": spec.bandwidth_gbs if bandwidth is None else bandwidth,
            "dense_tflops": spec.dense_tflops if tflops is None else tflops,
            "nvlink": spec.has_nvlink if nvlink is None else nvlink,
        }
    if mem is None:
        raise CapacityInputError("without --gpu, give --gpu-mem-gb")
    return {
        "gpu_name": "custom",
        "gpu_mem": mem,
        "bandwidth_gbs": bandwidth,
        "dense_tflops": tflops,
        "nvlink": bool(nvlink),
    }


def _sim_preset(gpu: str | None) -> SimGpu | None:
    """The sim calibration preset of the planner's GPU preset `gpu`, if it has one."""
    return next((k for k, v in GPU_OF.items() if gpu is not None and v == gpu.lower()), None)


def plan_frames(model: str | None, gpu: str | None, precision: str) -> float | None:
    """Frames/s one GPU serves at 100 % busy (`calibration.frames_per_second`: the sim's
    figures), or None where the model or the GPU has no sim calibration."""
    preset = _sim_preset(gpu)
    if preset is None or model is None or model.lower() not in SIM_MODELS:
        return None
    return frames_per_second(sim_calibration(preset, model, precision))


def _efficiencies(
    gpu: str | None, precision: str, mfu: float | None, bw_efficiency: float | None
) -> tuple[float, float, float | None]:
    """(MFU, eta_bw, FP8 TFLOPS or None): the sim's efficiencies for a GPU it calibrates,
    the planner's defaults otherwise; what is given explicitly wins."""
    preset = _sim_preset(gpu)
    eff = EFFICIENCY[preset] if preset is not None else None
    fp8 = None
    if precision == "fp8":
        spec = gpu_preset(gpu) if gpu is not None else None
        fp8 = peak_flops(spec, "fp8") / 1e12 if spec is not None else None
    return (
        mfu if mfu is not None else (eff.prefill_mfu if eff else DEFAULT_MFU),
        bw_efficiency if bw_efficiency is not None else (
            eff.bw_efficiency if eff else DEFAULT_BW_EFFICIENCY),
        fp8,
    )  # fmt: skip


def _splits(
    model: str | None, gpu: str | None, precision: str, roles: str, gpus: int,
    tokens: int | None, slo_ms: float | None, fixed_ms: float, context: int,
) -> RolePlan:  # fmt: skip
    """`--roles`: the ceilings of the splits asked for (`auto`: all) and the best of them."""
    preset = _sim_preset(gpu)
    if preset is None or model is None or model.lower() not in SIM_MODELS:
        raise CapacityInputError(
            f"--roles: needs --model of {', '.join(SIM_MODELS)} and --gpu of "
            f"{', '.join(GPU_OF.values())} (the sim's calibrations)"
        )
    if roles != "auto":
        try:
            split = role_split(roles)
        except ValueError as exc:
            raise CapacityInputError(f"--roles: {exc}") from None
        if len(split) != gpus:
            raise CapacityInputError(f"--roles: {roles} names {len(split)} workers, "
                                     f"--pool-gpus is {gpus}")  # fmt: skip
    cal = sim_calibration(preset, model, precision)
    slo = (slo_ms if slo_ms is not None else DEFAULT_STEP_SLO_MS) / 1000
    ceilings = split_ceilings(cal, gpus, tokens or ANSWER_TOKENS, slo, fixed_ms / 1000,
                              context)  # fmt: skip
    if roles != "auto":
        ceilings = [c for c in ceilings if c.roles in (roles, f"{gpus}b")]
    return RolePlan(ceilings, best_split(ceilings))


def _render_splits(splits: RolePlan) -> None:
    t = Table("roles", "decode batch", "steps/s at 100 % busy", "prefill / decode ceiling",
              "limit", title="agent pool by role (ceilings; sy agent-sim --search measures "
              "what the SLO allows)")  # fmt: skip
    for c in splits.ceilings:
        mark = " (recommended)" if c == splits.best else ""
        t.add_row(f"{c.roles}{mark}", str(c.batch), f"{c.steps_per_s:.1f}",
                  f"{c.prefill_steps_per_s:.1f} / {c.decode_steps_per_s:.1f}", c.limit)  # fmt: skip
    console.print(t)


def _list_presets(as_json: bool) -> None:
    if as_json:
        print(json.dumps({
            "models": {k: m.model_dump() for k, m in MODELS.items()},
            "gpus": {k: g.model_dump() for k, g in GPUS.items()},
        }))  # fmt: skip
        return
    models = Table("--model", "name", "params (B)", "layers", "KV heads", "head dim", "source")
    for key, m in MODELS.items():
        models.add_row(
            key, m.name, f"{m.params_b:g}", str(m.layers), str(m.kv_heads), str(m.head_dim),
            m.source,
        )  # fmt: skip
    gpus = Table(
        "--gpu", "name", "memory (GB)", "bandwidth (GB/s)", "dense BF16 TFLOPS", "NVLink (GB/s)"
    )
    for key, g in GPUS.items():
        gpus.add_row(
            key, g.name, f"{g.memory_gb:g}", f"{g.bandwidth_gbs:g}", f"{g.dense_tflops:g}",
            f"{g.nvlink_gbs:g}" if g.nvlink_gbs else "none (PCIe)",
        )  # fmt: skip
    console.print(models)
    console.print(gpus)
    console.print(UNITS_NOTE)


def _opt(value: float | None, fmt: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def _render(result: CapacityPlan) -> None:
    req, mem, fleet = result.request, result.memory, result.fleet
    unit = req.mem_unit.value
    t = Table("quantity", "value", title=f"{req.model.name} on {req.gpu_name}", show_header=False)
    t.add_row("GPUs per replica", str(fleet.replica_gpus))
    t.add_row("weights", f"{mem.weights_bytes / 1e9:.2f} GB ({mem.weights_bytes / 2**30:.2f} GiB)")
    t.add_row("usable memory (×util)", f"{mem.usable_bytes / 1e9:.2f} GB")
    t.add_row("overhead", f"{mem.overhead_bytes / 1e9:.2f} GB")
    t.add_row(
        "KV per token",
        f"{mem.kv_bytes_per_token:,.0f} B ({mem.kv_bytes_per_token / 2**20:.4f} MiB)",
    )
    t.add_row("KV budget", f"{mem.kv_budget_gb:.2f} GB ({mem.kv_budget_gib:.2f} GiB)")
    t.add_row(
        f"KV per request ({mem.kv_tokens_per_request} tokens)",
        f"{mem.kv_per_request_gb:.3f} GB ({mem.kv_per_request_gib:.3f} GiB)",
    )
    t.add_row("max concurrency (memory)", str(mem.max_concurrency))
    t.add_row("interconnect", result.interconnect.advice)
    perf = result.performance
    if perf is not None:
        t.add_row("operating batch", str(perf.batch))
        t.add_row("TPOT / decode step", f"{perf.tpot_ms:.1f} ms")
        t.add_row("decode throughput", f"{perf.decode_tokens_per_s:,.0f} tokens/s per replica")
        t.add_row("prefill (uncached prompt)", f"{perf.prefill_ms:.0f} ms")
        t.add_row("TTFT (no queue)", f"{perf.ttft_ms:.0f} ms")
        t.add_row("requests/s per replica", _opt(perf.requests_per_s, ".2f"))
    else:
        t.add_row("speed", "- (give --gpu or --bandwidth-gbs and --tflops)")
    t.add_row(
        "replicas by memory / SLO / throughput",
        f"{_opt(fleet.replicas_by_memory, 'd')} / {_opt(fleet.replicas_by_slo, 'd')}"
        f" / {_opt(fleet.replicas_by_throughput, 'd')}",
    )
    t.add_row(
        "GPUs needed",
        f"{_opt(fleet.total_gpus, 'd')} = ({_opt(fleet.replicas, 'd')} + {fleet.spare_replicas}"
        f" spare) × {fleet.replica_gpus}",
    )
    if result.cost_per_million_output_tokens is not None:
        t.add_row(
            f"cost per 1M output tokens (U={req.utilisation:g})",
            f"${result.cost_per_million_output_tokens:.2f}",
        )
    if result.cost_per_thousand_requests is not None:
        t.add_row("cost per 1,000 requests", f"${result.cost_per_thousand_requests:.4f}")
    agent = result.agent
    if agent is not None:
        s = agent.step
        t.add_row(
            f"agent step at batch {agent.batch}",
            f"{s.fixed_ms:.0f} ms fixed + {s.ttft_ms:.0f} ms TTFT + {s.tpot_ms:.1f} ms × (O − 1)",
        )
        if agent.max_output_tokens is not None:
            t.add_row(
                f"max output tokens for a {agent.step_slo_ms:g} ms step",
                str(agent.max_output_tokens),
            )
        if agent.step_ms is not None:
            t.add_row(
                f"step latency at {agent.output_tokens} output tokens", f"{agent.step_ms:.0f} ms"
            )
    for problem in fleet.problems:
        t.add_row("[red]problem[/red]", problem)
    # Outside the table and unwrapped, so the units line survives any terminal width.
    console.print(f"units: {UNITS_NOTE}; bare memory inputs read as {unit}", soft_wrap=True)
    console.print(t)


def plan_cmd(
    model: str | None = typer.Option(None, "--model", help=f"preset: {', '.join(MODELS)}"),
    gpu: str | None = typer.Option(None, "--gpu", help=f"preset: {', '.join(GPUS)}"),
    params: str | None = typer.Option(
        None, "--params", help="parameters: 70e9, 70B, 7.6b, 135M; bare < 10000 = billions"
    ),
    layers: int | None = typer.Option(None, "--layers"),
    kv_heads: int | None = typer.Option(None, "--kv-heads"),
    head_dim: int | None = typer.Option(None, "--head-dim"),
    precision: str = typer.Option(
        "bf16", "--precision", help="bf16 or fp8 (W8A8: 1-byte weights, the card's FP8 rate)"
    ),
    weight_bytes: float | None = typer.Option(
        None, "--weight-bytes", help="per parameter: 2 BF16, 1 FP8 (default: --precision's)"
    ),
    weights_gb: float | None = typer.Option(
        None, "--weights-gb", help="weights as a memory figure (overrides params × bytes)"
    ),
    kv_bytes: float = typer.Option(2, "--kv-bytes", help="per KV element: 2 FP16, 1 FP8"),
    gpu_mem_gb: float | None = typer.Option(None, "--gpu-mem-gb", help="memory per GPU"),
    bandwidth_gbs: float | None = typer.Option(None, "--bandwidth-gbs", help="per GPU, GB/s"),
    tflops: float | None = typer.Option(None, "--tflops", help="dense BF16 TFLOPS per GPU"),
    nvlink: bool | None = typer.Option(None, "--nvlink/--no-nvlink", help="default: preset's"),
    gpus: int | None = typer.Option(
        None, "--gpus", min=1, help="GPUs per replica (TP); default: fewest that fit"
    ),
    util: float = typer.Option(0.9, "--util", help="GPU memory fraction the engine may use"),
    overhead_gb: float | None = typer.Option(
        None, "--overhead-gb", help="activations + workspace per replica (default 4 per GPU)"
    ),
    context: int = typer.Option(8192, "--context", help="tokens per sequence (prompt + output)"),
    mem_unit: MemUnit = typer.Option(
        MemUnit.GB, "--mem-unit", help="how to read bare memory figures: GB=10^9, GiB=2^30"
    ),
    block_tokens: int = typer.Option(16, "--block-tokens", help="KV block size (vLLM: 16)"),
    bw_efficiency: float | None = typer.Option(
        None,
        "--bw-efficiency",
        help=f"default: the sim's for its GPUs, else {DEFAULT_BW_EFFICIENCY}",
    ),
    mfu: float | None = typer.Option(
        None, "--mfu", help=f"prefill MFU; default: the sim's for its GPUs, else {DEFAULT_MFU}"
    ),
    concurrency: int | None = typer.Option(None, "--concurrency", help="target sequences"),
    target_rps: float | None = typer.Option(None, "--target-rps", help="target requests/s"),
    prompt_tokens: int | None = typer.Option(
        None, "--prompt-tokens", help="default: context − output tokens"
    ),
    output_tokens: int | None = typer.Option(None, "--output-tokens", help="per request"),
    prefix_hit: float = typer.Option(0.0, "--prefix-hit", help="cached fraction of the prompt"),
    slo_tpot_ms: float | None = typer.Option(None, "--slo-tpot-ms"),
    slo_ttft_ms: float | None = typer.Option(None, "--slo-ttft-ms"),
    redundancy: int = typer.Option(0, "--redundancy", min=0, help="spare replicas: 1 = N+1"),
    gpu_price_per_hour: float | None = typer.Option(None, "--gpu-price-per-hour"),
    utilisation: float = typer.Option(1.0, "--utilisation", help="average load, for cost"),
    step_slo_ms: float | None = typer.Option(None, "--step-slo-ms", help="agent step SLO"),
    fixed_ms: float = typer.Option(
        DEFAULT_FIXED_MS, "--fixed-ms", help="network + preprocessing + routing per step"
    ),
    roles: str | None = typer.Option(
        None,
        "--roles",
        help="an agent pool's role split (7p1d), or auto: every split's "
        "ceiling and the recommended one (#39; needs a GPU and model the sim calibrates)",
    ),
    pool_gpus: int = typer.Option(8, "--pool-gpus", min=2, help="GPUs of the --roles pool"),
    list_presets: bool = typer.Option(False, "--list-presets"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Memory, speed, GPUs, cost and the agent latency budget of a model on a GPU."""
    if list_presets:
        _list_presets(as_json)
        return
    if precision not in PRECISIONS:
        err.print(f"error: --precision: one of {', '.join(PRECISIONS)}")
        raise typer.Exit(2)
    try:
        mfu, bw_efficiency, fp8_tflops = _efficiencies(gpu, precision, mfu, bw_efficiency)
        if weight_bytes is None:
            weight_bytes = 1 if precision == "fp8" else 2
        hardware = _gpu(gpu, gpu_mem_gb, bandwidth_gbs, tflops, nvlink)
        if fp8_tflops is not None and tflops is None:
            hardware["dense_tflops"] = fp8_tflops
        frames = plan_frames(model, gpu, precision)
        splits = None
        if roles is not None:
            splits = _splits(model, gpu, precision, roles, pool_gpus, output_tokens,
                             step_slo_ms, fixed_ms, context)  # fmt: skip
        request = PlanRequest(
            model=_model(model, params, layers, kv_heads, head_dim),
            **hardware,
            gpus=gpus, util=util, overhead=overhead_gb, weight_bytes=weight_bytes,
            weights=weights_gb, kv_bytes=kv_bytes, context=context, block_tokens=block_tokens,
            mem_unit=mem_unit, bw_efficiency=bw_efficiency, mfu=mfu, concurrency=concurrency,
            target_rps=target_rps, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
            prefix_hit=prefix_hit, slo_tpot_ms=slo_tpot_ms, slo_ttft_ms=slo_ttft_ms,
            redundancy=redundancy, gpu_price_per_hour=gpu_price_per_hour,
            utilisation=utilisation, step_slo_ms=step_slo_ms, fixed_ms=fixed_ms,
        )  # fmt: skip
        result = plan(request)
    except CapacityInputError as exc:  # ModelDoesNotFit included
        err.print(f"error: {exc.reason}", soft_wrap=True)
        raise typer.Exit(2) from None
    except ValidationError as exc:
        for e in exc.errors():
            # A cross-field check has no field of its own: its message names the inputs.
            msg = e["msg"].removeprefix("Value error, ")
            where = f"{_flag(e['loc'])}: " if e["loc"] else ""
            err.print(f"error: {where}{msg}", soft_wrap=True)
        raise typer.Exit(2) from None
    if as_json:
        extra = {"roles": splits.as_dict()} if splits is not None else {}
        print(json.dumps({**result.as_dict(), "precision": precision,
                          "frames_per_s_per_gpu_at_full_busy": frames, **extra}))  # fmt: skip
        return
    _render(result)
    if frames is not None:
        console.print(
            f"frames/s per GPU at 100 % busy ({precision}, the sim's calibration): {frames:.2f}"
        )
    if splits is not None:
        _render_splits(splits)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)
