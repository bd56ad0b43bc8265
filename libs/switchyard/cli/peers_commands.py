"""`sy bench peers overhead|routing|all`: Switchyard against vllm-router and smg in one run."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from switchyard.bench.routeload import AGENT_ACT_S, ChatConfig
from switchyard.cli import console

if TYPE_CHECKING:
    from switchyard.bench.peers.overhead import OverheadConfig
    from switchyard.bench.peers.routing import RoutingConfig

peers = typer.Typer(
    help="Switchyard against vLLM's router and SGLang's gateway (smg), on sim backends.",
    no_args_is_help=True,
)

# The agreed place for the artefacts; a fixed, documented path, not a temp file.
OUT = typer.Option(
    Path("/tmp/bench-peers"),  # noqa: S108
    "--out",
    help="directory for JSON, PNG and logs",
)
AS_JSON = typer.Option(False, "--json", help="print one JSON object instead of tables")


def _run(
    out: Path, as_json: bool, overhead_cfg: OverheadConfig | None,
    routing_cfg: RoutingConfig | None,
) -> None:  # fmt: skip
    from switchyard.bench.peers import report
    from switchyard.bench.peers.overhead import run_overhead
    from switchyard.bench.peers.peers import versions
    from switchyard.bench.peers.routing import run_routing
    from switchyard.fleet import FleetError
    from switchyard.logging import configure

    configure("warning", service="sy-bench", json=False)  # keep stdout for the result
    _stop_cleanly_on_signals()
    out.mkdir(parents=True, exist_ok=True)
    found = versions()
    missing = [name for name, v in found.items() if v == "not installed"]
    if missing:
        console.print(f"[red]not installed: {', '.join(missing)}; run `.venv/bin/pip install "
                      f"-e '.[bench]'` (or `make bench-peers`)[/red]")  # fmt: skip
        raise typer.Exit(2)
    try:
        overhead = run_overhead(overhead_cfg, out / "logs") if overhead_cfg else None
        routing = run_routing(routing_cfg, out / "logs") if routing_cfg else None
    except FleetError as e:
        console.print(f"[red]a process could not start:[/red] {e}")
        raise typer.Exit(3) from e
    doc = report.document(overhead, routing, found)
    report.write_json(out / "peers.json", doc)
    report.write_png(out / "peers.png", overhead, routing, found)
    written = [out / "peers.json", out / "peers.png"]
    if routing is not None:
        written.append(out / f"routing-{routing.config.workload}.md")
        written[-1].write_text(report.routing_markdown(routing))
    if as_json:
        import json

        print(json.dumps(doc))
        return
    report.print_tables(console, overhead, routing, found)
    console.print(f"written: {', '.join(map(str, written))}; logs in {out / 'logs'}")


def _stop_cleanly_on_signals() -> None:
    """SIGTERM, and SIGINT even where the shell started us with it ignored (`cmd &`), raise
    KeyboardInterrupt: asyncio then cancels the run and every `ProcessGroup` stops the
    processes it started (they run in their own sessions, so nothing else would)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)


def _overhead_cfg(
    requests: int, concurrency: int, block: int, tls: bool = False,
    trace_samples: list[float] | None = None,
) -> OverheadConfig:  # fmt: skip
    from switchyard.bench.peers.overhead import OverheadConfig

    samples = tuple(trace_samples or ())
    if any(not 0.0 <= r <= 1.0 for r in samples):
        raise typer.BadParameter(f"--trace-sample takes ratios from 0 to 1, not {samples}")
    return OverheadConfig(requests=requests, concurrency=concurrency, block=min(block, requests),
                          tls=tls, trace_samples=samples)  # fmt: skip


def _routing_cfg(sessions: int, steps: int, backends: int, delay_scale: float, seed: int,
                 policy: list[str] | None, workload: str, tenants: int, conversations: int,
                 turns: int, one_shots: int, lanes: int,
                 act_s: float) -> RoutingConfig:  # fmt: skip
    from switchyard.bench.peers.routing import ALL_POLICIES, RoutingConfig
    from switchyard.bench.routeload import WORKLOADS

    chosen = tuple(policy) if policy else ALL_POLICIES
    bad = [p for p in chosen if p not in ALL_POLICIES]
    if bad:
        raise typer.BadParameter(f"unknown policy {bad}; choose from {list(ALL_POLICIES)}")
    if workload not in WORKLOADS:
        raise typer.BadParameter(f"--workload must be one of {', '.join(WORKLOADS)}")
    if workload == "chat" and conversations + one_shots == 0:
        raise typer.BadParameter("the chat workload needs conversations or one-shot requests")
    chat = ChatConfig(tenants, conversations, turns, one_shots, lanes, seed=seed)
    return RoutingConfig(sessions, steps, backends, delay_scale, seed, chosen,
                         workload, chat, act_s)  # fmt: skip


REQUESTS = typer.Option(2000, min=10, help="overhead: requests per path")
CONCURRENCY = typer.Option(8, min=1, help="overhead: requests in flight")
BLOCK = typer.Option(200, min=10, help="overhead: requests per interleaved block")
TLS = typer.Option(
    False, "--tls", help="overhead: Switchyard's NATS over TLS with client certificates"
)
TRACE_SAMPLE = typer.Option(
    None, "--trace-sample",
    help="overhead: also a Switchyard edge with OpenTelemetry on at this head-sampling ratio "
         "(0..1, repeatable), exporting to a local OTLP sink",
)  # fmt: skip
WORKLOAD = typer.Option("agent", help="routing: agent (episodes) or chat (tenants)")
SESSIONS = typer.Option(200, min=1, help="routing, agent: episodes, all at once")
STEPS = typer.Option(20, min=1, help="routing, agent: steps per episode")
ACT = typer.Option(
    AGENT_ACT_S, "--act-s", min=0.0, help="routing, agent: modelled s a phone acts between steps"
)
_CHAT = ChatConfig()  # the chat workload's defaults
TENANTS = typer.Option(_CHAT.tenants, min=1, help="routing, chat: tenants, each its own prompt")
CONVERSATIONS = typer.Option(
    _CHAT.conversations, min=0, help="routing, chat: multi-turn conversations"
)
TURNS = typer.Option(_CHAT.turns, min=1, help="routing, chat: turns per conversation")
ONE_SHOTS = typer.Option(_CHAT.one_shots, min=0, help="routing, chat: single-turn requests")
LANES = typer.Option(_CHAT.concurrency, min=1, help="routing, chat: client lanes, one job each")
BACKENDS = typer.Option(8, min=1, help="routing: sim backends / workers")
DELAY = typer.Option(1.0, min=0.0, help="routing: sim wall s per modelled s")
SEED = typer.Option(0, min=0)
POLICY = typer.Option(None, "--policy", help="routing: only these columns (repeatable)")


@peers.command("overhead")
def overhead_cmd(
    requests: int = REQUESTS, concurrency: int = CONCURRENCY, block: int = BLOCK,
    out: Path = OUT, as_json: bool = AS_JSON, tls: bool = TLS,
    trace_sample: list[float] | None = TRACE_SAMPLE,
) -> None:  # fmt: skip
    """Latency each router adds over one sim server, all paths interleaved in one run."""
    _run(out, as_json, _overhead_cfg(requests, concurrency, block, tls, trace_sample), None)


@peers.command("routing")
def routing_cmd(
    workload: str = WORKLOAD, sessions: int = SESSIONS, steps: int = STEPS,
    tenants: int = TENANTS, conversations: int = CONVERSATIONS, turns: int = TURNS,
    one_shots: int = ONE_SHOTS, lanes: int = LANES, backends: int = BACKENDS,
    delay_scale: float = DELAY, seed: int = SEED, policy: list[str] | None = POLICY,
    out: Path = OUT, as_json: bool = AS_JSON, act_s: float = ACT,
) -> None:  # fmt: skip
    """Prefix-cache hits, latency and balance of each routing policy on one workload."""
    _run(out, as_json, None, _routing_cfg(sessions, steps, backends, delay_scale, seed, policy,
                                          workload, tenants, conversations, turns, one_shots,
                                          lanes, act_s))  # fmt: skip


@peers.command("all")
def all_cmd(
    requests: int = REQUESTS, concurrency: int = CONCURRENCY, block: int = BLOCK,
    workload: str = WORKLOAD, sessions: int = SESSIONS, steps: int = STEPS,
    tenants: int = TENANTS, conversations: int = CONVERSATIONS, turns: int = TURNS,
    one_shots: int = ONE_SHOTS, lanes: int = LANES, backends: int = BACKENDS,
    delay_scale: float = DELAY, seed: int = SEED, policy: list[str] | None = POLICY,
    out: Path = OUT, as_json: bool = AS_JSON, act_s: float = ACT,
) -> None:  # fmt: skip
    """Both runs, one after the other; one JSON, one PNG."""
    _run(out, as_json, _overhead_cfg(requests, concurrency, block),
         _routing_cfg(sessions, steps, backends, delay_scale, seed, policy, workload, tenants,
                      conversations, turns, one_shots, lanes, act_s))  # fmt: skip


def register(bench: typer.Typer) -> None:
    bench.add_typer(peers, name="peers")
