"""`sy sim-server`: one simulated vLLM engine behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

import typer
from pydantic import ValidationError


def sim_server(
    host: str = typer.Option("127.0.0.1", help="address to bind"),
    port: int = typer.Option(8100, min=1, max=65535),
    model: str = typer.Option("sim", help="the model id /v1/models reports"),
    delay_scale: float = typer.Option(
        1.0, min=0, help="wall s per modelled s; 0 answers instantly (overhead runs)"
    ),
    gpu: str | None = typer.Option(
        None,
        help="calibration preset: a100, h100 or rtx5090 (default: SY_SIM_GPU, else a100)",
    ),
    kv_blocks: int | None = typer.Option(
        None, min=1, help="KV cache size in 16-token blocks (default: SY_SIM_KV_CAPACITY_TOKENS)"
    ),
    max_num_seqs: int | None = typer.Option(None, min=1, help="batch cap (default: 64)"),
    seed: int = typer.Option(0, min=0),
    log_level: str = typer.Option("warning", help="uvicorn log level"),
) -> None:
    """Serve a `sim` engine (a simulator, not a model) with vLLM's API and metric names."""
    from switchyard.engines.sim import SimSettings
    from switchyard.logging import configure
    from switchyard.simserver.server import run_sim_server

    overrides: dict[str, object] = {"delay_scale": delay_scale, "seed": seed}
    if max_num_seqs is not None:
        overrides["max_num_seqs"] = max_num_seqs
    if gpu is not None:
        overrides["gpu"] = gpu
    try:
        settings = SimSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as e:
        raise typer.BadParameter(_first_error(e)) from None
    if kv_blocks is not None:
        settings = settings.model_copy(
            update={"kv_capacity_tokens": kv_blocks * settings.block_size}
        )
    # Only once the flags are sound: a refused flag leaves the process's logging as it was.
    configure("warning", service="sy-sim-server", json=False)
    run_sim_server(settings, host=host, port=port, model=model, log_level=log_level)


def _first_error(e: ValidationError) -> str:
    first = e.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg"))


def register(app: typer.Typer) -> None:
    app.command("sim-server")(sim_server)
