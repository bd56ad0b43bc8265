"""`sy agent-sim`: the cloud-phone simulator."""

from __future__ import annotations

import json
from dataclasses import asdict

import typer
from rich.console import Console


def agent_sim(
    phones: int = typer.Option(8, min=1, help="concurrent episodes"),
    steps: int = typer.Option(10, min=1, max=256, help="steps per episode"),
    engine: str = typer.Option("llamacpp", help="llamacpp or sim (the GPU simulator)"),
    workers: int | None = typer.Option(None, min=1, help="default: 8 for sim, 1 otherwise"),
    resolution: str = typer.Option("1280x720", help="frame size WxH"),
    stale_after: float | None = typer.Option(None, help="s; default 2 (sim), 60 (llamacpp)"),
    max_tokens: int = typer.Option(48, min=8, max=512),
    scatter: bool = typer.Option(False, help="new partition key per step (no affinity)"),
    nats_url: str | None = typer.Option(None, "--nats", help="a running fleet; start nothing"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """N phones, each a strict step -> action loop; latency, staleness and prefix reuse."""
    from switchyard.bench.agentsim import AgentSimConfig, run_agent_sim

    w, _, h = resolution.partition("x")
    cfg = AgentSimConfig(
        phones=phones, steps=steps, engine=engine,
        workers=workers or (8 if engine == "sim" else 1), width=int(w), height=int(h),
        # llama.cpp on a CPU serves one step at a time: a 2 s budget would drop most.
        stale_after=stale_after or (2.0 if engine == "sim" else 60.0),
        max_tokens=max_tokens, scatter=scatter, nats_url=nats_url,
    )  # fmt: skip
    report = run_agent_sim(cfg)
    if as_json:
        print(json.dumps(report.as_dict()))
        return
    Console().print_json(json.dumps({k: v for k, v in asdict(report).items() if k != "config"}))


def register(app: typer.Typer) -> None:
    app.command("agent-sim")(agent_sim)
